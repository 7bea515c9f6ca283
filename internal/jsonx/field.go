package jsonx

// Field returns the exact text of the top-level member named key of the JSON
// object in data, or nil when data is not an object or has no such member.
//
// It is for JSON the kernel wrote itself (event payloads), which is known to
// be valid: it skips values without checking them and without allocating,
// where Parse would build the whole tree to read one member. Keys are
// compared as written, so a key spelled with escapes never matches; the
// kernel's writer escapes only what JSON requires. Malformed input gives nil
// or an arbitrary span of data, never a panic.
func Field(data []byte, key string) []byte {
	start, end := FieldSpan(data, key)
	if start < 0 {
		return nil
	}
	return data[start:end:end]
}

// FieldSpan is Field's answer as offsets into data, or -1, -1: for a caller
// that splices a new value in.
func FieldSpan(data []byte, key string) (start, end int) {
	i := skipWS(data, 0)
	if i >= len(data) || data[i] != '{' {
		return -1, -1
	}
	i = skipWS(data, i+1)
	for i < len(data) && data[i] == '"' {
		keyEnd := skipString(data, i)
		if keyEnd < 0 {
			return -1, -1
		}
		name := data[i+1 : keyEnd-1]
		i = skipWS(data, keyEnd)
		if i >= len(data) || data[i] != ':' {
			return -1, -1
		}
		i = skipWS(data, i+1)
		end := skipValue(data, i)
		if end < 0 {
			return -1, -1
		}
		if string(name) == key {
			return i, end
		}
		i = skipWS(data, end)
		if i >= len(data) || data[i] != ',' {
			return -1, -1
		}
		i = skipWS(data, i+1)
	}
	return -1, -1
}

// skipString returns the offset just past the string that opens at i, or -1
// when it does not close.
func skipString(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the offset just past the value that starts at i, or -1
// when it does not end.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				if j = skipString(data, j); j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(data) {
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
		j++
	}
	return j
}

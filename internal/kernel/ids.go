package kernel

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"time"

	"github.com/google/uuid"
)

// newID returns a UUIDv7 for executions, approvals and requests.
func newID() string { return uuid.Must(uuid.NewV7()).String() }

// newDispatchID returns a UUIDv7 greater than prev, so that the dispatch ids
// of one execution strictly increase even if this replica's clock is behind
// the one that made prev (docs/protocol/dispatch.md §2).
func newDispatchID(prev string, now time.Time) string {
	ms := now.UnixMilli()
	if p, err := uuid.Parse(prev); err == nil && prev != "" {
		if pms := int64(binary.BigEndian.Uint64(append([]byte{0, 0}, p[:6]...))); pms >= ms {
			ms = pms + 1
		}
	}
	id := v7At(ms)
	if strings.Compare(id, prev) <= 0 {
		return v7At(ms + 1)
	}
	return id
}

func v7At(ms int64) string {
	var u uuid.UUID
	if _, err := rand.Read(u[6:]); err != nil {
		panic(err)
	}
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms))
	copy(u[:6], ts[2:])
	u[6] = 0x70 | (u[6] & 0x0f)
	u[8] = 0x80 | (u[8] & 0x3f)
	return u.String()
}

package repl

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The REPL keeps its history itself rather than through readline's file
// support, because readline creates and rewrites that file world-readable and
// records every line, and a line typed here can hold a secret
// (`agent add --secret …`, `--token …`). The file is the user's alone (0600,
// tightened when found wider), lines that carry a secret never reach it, and
// it is trimmed to the newest historyKeep lines when opened.

const historyKeep = 1000

type history struct {
	f *os.File
}

// openHistory opens (creating) the history file and returns the lines to
// offer for recall, oldest first. A nil history keeps nothing.
func openHistory(path string) (*history, []string, error) {
	if path == "" {
		return nil, nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open REPL history: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("restrict REPL history to its owner: %w", err)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		// Lines written before secrets were kept out are dropped too.
		if line := sc.Text(); line != "" && !carriesSecret(line) {
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read REPL history: %w", err)
	}
	if len(lines) > historyKeep {
		lines = lines[len(lines)-historyKeep:]
	}
	if err := rewrite(f, lines); err != nil {
		f.Close()
		return nil, nil, err
	}
	return &history{f: f}, lines, nil
}

// rewrite replaces the file's content with lines, through a private
// temporary file renamed over it, so that a crash leaves one or the other.
func rewrite(f *os.File, lines []string) error {
	tmp, err := os.CreateTemp(filepath.Dir(f.Name()), ".rebuno_repl_history-*")
	if err != nil {
		return fmt.Errorf("rewrite REPL history: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriter(tmp)
	for _, l := range lines {
		w.WriteString(l)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("rewrite REPL history: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("rewrite REPL history: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.Name()); err != nil {
		return fmt.Errorf("rewrite REPL history: %w", err)
	}
	// f still points at the replaced file: reopen for appends.
	nf, err := os.OpenFile(f.Name(), os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("reopen REPL history: %w", err)
	}
	f.Close()
	*f = *nf
	return nil
}

// add appends line unless it carries a secret; it reports whether the line
// may be recalled.
func (h *history) add(line string) bool {
	line = strings.TrimSpace(line)
	if line == "" || carriesSecret(line) {
		return false
	}
	if h != nil {
		io.WriteString(h.f, line+"\n")
	}
	return true
}

func (h *history) close() {
	if h != nil {
		h.f.Close()
	}
}

// secretFlags are the options whose value is a secret.
var secretFlags = []string{"--secret", "--token", "--bearer-token"}

// carriesSecret reports a line that names a secret: one of secretFlags (as
// `--flag value` or `--flag=value`) or a bearer credential.
func carriesSecret(line string) bool {
	for _, field := range strings.Fields(line) {
		name, _, _ := strings.Cut(field, "=")
		for _, flag := range secretFlags {
			if name == flag {
				return true
			}
		}
	}
	return strings.Contains(strings.ToLower(line), "bearer ")
}

package postgres

import (
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT a FROM t WHERE x = ? AND y = ?`, `SELECT a FROM t WHERE x = $1 AND y = $2`},
		// ?N names a value; a bare ? takes the number after the largest so far.
		{`VALUES (?1,?,?),(?1,?,?)`, `VALUES ($1,$2,$3),($1,$4,$5)`},
		{`SELECT ?3, ?, ?1`, `SELECT $3, $4, $1`},
		// Quoted text is not a placeholder.
		{`WHERE s = '?' AND t = ? AND u <> ''`, `WHERE s = '?' AND t = $1 AND u <> ''`},
		{`SELECT pg_advisory_xact_lock(?)`, `SELECT pg_advisory_xact_lock($1)`},
	} {
		if got := rebind(c.in); got != c.want {
			t.Errorf("rebind(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := (dialect{}).Rebind(c.in); got != c.want {
			t.Errorf("Rebind(%q) = %q, want %q (remembered)", c.in, got, c.want)
		}
	}
}

func TestMigrationsAreNumbered(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || SchemaVersion() != len(ms) {
		t.Fatalf("%d migrations, SchemaVersion %d", len(ms), SchemaVersion())
	}
}

func TestNotificationPayloads(t *testing.T) {
	n := &notifier{origin: "o-1"}
	for _, ref := range []string{"", "row-7"} {
		for _, data := range []string{"", "x", "line\nbreak\n=@", `{"s":"a","q":1,"d":"é"}`} {
			msg := n.encode(storeNotification("delta", "exec-1", data), ref)
			origin, got, gotRef, ok := decode(msg)
			if !ok || origin != "o-1" || got.Topic != "delta" || got.Key != "exec-1" || gotRef != ref {
				t.Fatalf("decode(encode(%q, ref %q)) = %q %+v %q %v", data, ref, origin, got, gotRef, ok)
			}
			if ref == "" && string(got.Data) != data {
				t.Fatalf("data %q came back as %q", data, got.Data)
			}
		}
	}
	for _, bad := range []string{"", "o\nt\nk\n", "o\nt\nk\n?x", "o\nt"} {
		if _, _, _, ok := decode(bad); ok {
			t.Errorf("decode(%q) accepted a malformed payload", bad)
		}
	}
	if !carried(strings.Repeat("a", maxPayload-1)) || carried(strings.Repeat("a", maxPayload)) || carried("a\x00b") || carried("\xff") {
		t.Error("carried: wrong answer about what NOTIFY can carry")
	}
}

func storeNotification(topic, key, data string) store.Notification {
	return store.Notification{Topic: topic, Key: key, Data: []byte(data)}
}

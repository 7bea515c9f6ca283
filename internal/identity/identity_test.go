package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/testvectors"
)

// The vectors are those of docs/protocol/vectors, which the Python and
// TypeScript SDK tests read too. They are bit-exact compatibility
// requirements: a mismatch means the code is wrong.

var (
	canonicalVectors = testvectors.LoadCanonical()
	stepIDVectors    = testvectors.LoadStepIDs()
	execID           = stepIDVectors.ExecutionID
	nullHash         = canonicalVectors.AbsentArgsHash
)

// readArgsHash is the args_hash of the published `{"path":"/tmp"}`.
var readArgsHash = stepIDVectors.Cases[0].ArgsHash

func TestCanonicalAndArgsHashVectors(t *testing.T) {
	if len(canonicalVectors.Cases) < 15 {
		t.Fatalf("only %d canonical vectors", len(canonicalVectors.Cases))
	}
	for _, tt := range canonicalVectors.Cases {
		t.Run(tt.Name, func(t *testing.T) {
			want := tt.Canonical()
			got, err := jsonx.CanonicalBytes([]byte(tt.Args), maxDepth)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("canonical\n got %q\nwant %q", got, want)
			}
			sum := sha256.Sum256(want)
			if hex.EncodeToString(sum[:]) != tt.ArgsHash {
				t.Fatalf("the vector's args_hash is not the SHA-256 of its canonical form")
			}
			h, err := ArgsHashBytes([]byte(tt.Args))
			if err != nil {
				t.Fatal(err)
			}
			if h != tt.ArgsHash {
				t.Errorf("ArgsHashBytes = %s, want %s", h, tt.ArgsHash)
			}
			v, err := jsonx.Parse([]byte(tt.Args), maxDepth)
			if err != nil {
				t.Fatal(err)
			}
			if h := ArgsHash(v); h != tt.ArgsHash {
				t.Errorf("ArgsHash = %s, want %s", h, tt.ArgsHash)
			}
		})
	}
}

func TestAbsentArgsHashLikeNull(t *testing.T) {
	if h := ArgsHash(nil); h != nullHash {
		t.Errorf("ArgsHash(nil) = %s, want %s", h, nullHash)
	}
	for _, raw := range [][]byte{nil, {}, []byte("null"), []byte(" null\n")} {
		h, err := ArgsHashBytes(raw)
		if err != nil || h != nullHash {
			t.Errorf("ArgsHashBytes(%q) = %s, %v; want %s", raw, h, err, nullHash)
		}
	}
}

func TestArgsHashBytesRejectsInvalid(t *testing.T) {
	deep := make([]byte, 0, 2*(maxDepth+1))
	for range maxDepth + 1 {
		deep = append(deep, '[')
	}
	for range maxDepth + 1 {
		deep = append(deep, ']')
	}
	for _, raw := range []string{" ", `{"a":1,"a":2}`, `NaN`, "\"\xff\"", `{"a":1} x`, string(deep)} {
		if h, err := ArgsHashBytes([]byte(raw)); err == nil {
			t.Errorf("ArgsHashBytes(%.20q) = %s, want error", raw, h)
		}
	}
	if _, err := ArgsHashBytes(deep[1 : len(deep)-1]); err != nil {
		t.Errorf("ArgsHashBytes refused %d levels of nesting: %v", maxDepth, err)
	}
}

func TestPreimageVector(t *testing.T) {
	for _, tt := range stepIDVectors.Cases {
		if got := string(appendPreimage(nil, execID, tt.Kind, tt.Target, tt.ArgsHash, tt.Occurrence)); got != tt.Preimage {
			t.Errorf("%s: preimage\n got %s\nwant %s", tt.Name, got, tt.Preimage)
		}
		// The step id is the SHA-256 of exactly that preimage.
		sum := sha256.Sum256([]byte(tt.Preimage))
		if got := StepID(execID, tt.Kind, tt.Target, tt.ArgsHash, tt.Occurrence); got != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: StepID does not hash the preimage: %s", tt.Name, got)
		}
	}
}

func TestPreimageFields(t *testing.T) {
	tests := []struct {
		kind, target string
		occ          int64
		want         string
	}{
		{"llm_call", "", 0, "36:" + execID + "8:llm_call0:1:h1:0"},
		{"local", "a:b", 10, "36:" + execID + "5:local3:a:b1:h2:10"},
		{"tool_call", "é", 1234567890123, "36:" + execID + "9:tool_call2:é1:h13:1234567890123"},
	}
	for _, tt := range tests {
		if got := string(appendPreimage(nil, execID, tt.kind, tt.target, "h", tt.occ)); got != tt.want {
			t.Errorf("preimage = %q, want %q", got, tt.want)
		}
	}
}

func TestStepIDVectors(t *testing.T) {
	if len(stepIDVectors.Cases) < 6 {
		t.Fatalf("only %d step id vectors", len(stepIDVectors.Cases))
	}
	for _, tt := range stepIDVectors.Cases {
		t.Run(tt.Name, func(t *testing.T) {
			h, err := ArgsHashBytes([]byte(tt.Args))
			if err != nil {
				t.Fatal(err)
			}
			if h != tt.ArgsHash {
				t.Errorf("args_hash = %s, want %s", h, tt.ArgsHash)
			}
			if got := StepID(execID, tt.Kind, tt.Target, h, tt.Occurrence); got != tt.StepID {
				t.Errorf("StepID = %s, want %s", got, tt.StepID)
			}
		})
	}
}

func TestLargeArgs(t *testing.T) {
	// Past the stack buffer of ArgsHash, the result must not change.
	big := make([]byte, 0, 5000)
	big = append(big, `{"z":"`...)
	for range 4000 {
		big = append(big, 'x')
	}
	big = append(big, `","a":1}`...)
	canon, err := jsonx.CanonicalBytes(big, maxDepth)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(canon)
	h, err := ArgsHashBytes(big)
	if err != nil || h != hex.EncodeToString(sum[:]) {
		t.Errorf("ArgsHashBytes(large) = %s, %v", h, err)
	}
}

// FuzzArgsHash checks that hashing never panics and that the hash depends
// only on the canonical form, which is what makes step ids stable across
// formatting differences between SDKs.
func FuzzArgsHash(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := ArgsHashBytes(raw)
		if err != nil {
			return
		}
		if len(h) != 64 {
			t.Fatalf("hash %q is not 64 hex characters", h)
		}
		canon, err := jsonx.CanonicalBytes(raw, maxDepth)
		if err != nil && len(raw) > 0 {
			t.Fatalf("hashed input does not canonicalise: %v", err)
		}
		if len(raw) == 0 {
			canon = []byte("null")
		}
		sum := sha256.Sum256(canon)
		if h != hex.EncodeToString(sum[:]) {
			t.Fatalf("hash %s is not the hash of the canonical form %q", h, canon)
		}
		if h2, err := ArgsHashBytes(canon); err != nil || h2 != h {
			t.Fatalf("canonical form hashes to %s (%v), input to %s", h2, err, h)
		}
	})
}

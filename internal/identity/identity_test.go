package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/rebuno/rebuno/internal/jsonx"
)

// The vectors below are copied from PROTOCOL.md §11.4. They are bit-exact
// compatibility requirements: a mismatch means the code is wrong.

const execID = "018ff0a0-0000-7000-8000-000000000001"

const (
	readArgs     = `{"path":"/tmp"}`
	readArgsHash = "ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e7247639"
	nullHash     = "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"
	d13Args      = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
)

func mustHex(t *testing.T, s string) string {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCanonicalAndArgsHashVectors(t *testing.T) {
	tests := []struct {
		name      string
		args      string
		canonical string // text
		canonHex  string // or hex, where the form has raw control bytes
		hash      string
	}{
		{"published canonical", `{"b":"<&>","a":"é\u2028"}`, `{"a":"é\u2028","b":"\u003c\u0026\u003e"}`, "", ""},
		{"published args_hash", readArgs, readArgs, "", readArgsHash},
		{"published null", `null`, `null`, "", nullHash},
		{"D1", `{"b":"<&>","a":"é\u2028"}`, `{"a":"é\u2028","b":"\u003c\u0026\u003e"}`, "", "a48f75fb205c4c4f6587c024b5ce2587fe9100c1b45ffc78e379fc22a59df526"},
		{"D2", `{}`, `{}`, "", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
		{"D3", `[]`, `[]`, "", "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"},
		{"D4", `"hello"`, `"hello"`, "", "5aa762ae383fbb727af3c7a36d4940a5b8c40a989452d2304fc958ff3f354e7a"},
		{"D5", `42`, `42`, "", "73475cb40a568e8da8a045ced110137e159f890ac4da883b6b17dc651b3a8049"},
		{"D6", `{ "b" : 1 , "a" : [ true , false , null ] , "c" : { "z" : "\n" , "y" : 1.0 } }`,
			`{"a":[true,false,null],"b":1,"c":{"y":1.0,"z":"\n"}}`, "", "205fa043afdd0b171222ade3a7a238e96b38629eeb3c60c0a888b1074556a099"},
		{"D7", `{"n":[1,1.0,1E2,-0,12345678901234567890,1e-7]}`, `{"n":[1,1.0,1E2,-0,12345678901234567890,1e-7]}`, "",
			"a0043e6d0a529bd4ff88f4618cd8f28a215b8a9a5cd407557c795c267171a6e0"},
		{"D8", `{"s":"\b\f\u0001\u001f\u007f\t\r\"\\\/"}`, "",
			"7b2273223a225c625c665c75303030315c75303031667f5c745c725c225c5c2f227d",
			"95203623d9f0eb4e6c1961784433436ecf1de1d960accf401190117a1f9ebe57"},
		{"D9", `{"é":1,"z":2,"A":3,"a":4}`, `{"A":3,"a":4,"z":2,"é":1}`, "", "5bed303ab65d461fdba6f1f905b2433b6462f29fc129d54498f86ba1aae07df4"},
		{"D10", `{"\uff41":1,"\ud83d\ude00":2}`, "", "7b22efbd81223a312c22f09f9880223a327d",
			"507afd20b4666759002be909c9ce520dcd824cf3f9b44b78b0b2a5b66631bf04"},
		{"D11", `{"x":"\ud800"}`, "", "7b2278223a22efbfbd227d", "6587c929901f4acd02e8476793f8299067f1e19c0afc2201a6b4be08b18de706"},
		{"D12", `{"q":"caf\u00e9 \u2029 <b>&amp;</b>"}`, `{"q":"café \u2029 \u003cb\u003e\u0026amp;\u003c/b\u003e"}`, "",
			"5bbabad99b76b49dc1edb105f0047a5eb5ac50793cc8a09e178c7887c63374cc"},
		{"D13", d13Args, `{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o"}`, "",
			"f6ba5028679eb60d0565209bd47356058dc9001b52bef518c77f9115949c479f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.canonical
			if tt.canonHex != "" {
				want = mustHex(t, tt.canonHex)
			}
			got, err := jsonx.CanonicalBytes([]byte(tt.args), maxDepth)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("canonical\n got %q\nwant %q", got, want)
			}
			if tt.hash == "" {
				return
			}
			h, err := ArgsHashBytes([]byte(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if h != tt.hash {
				t.Errorf("ArgsHashBytes = %s, want %s", h, tt.hash)
			}
			v, err := jsonx.Parse([]byte(tt.args), maxDepth)
			if err != nil {
				t.Fatal(err)
			}
			if h := ArgsHash(v); h != tt.hash {
				t.Errorf("ArgsHash = %s, want %s", h, tt.hash)
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
	const want = "36:018ff0a0-0000-7000-8000-0000000000019:tool_call4:read64:ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e72476391:0"
	if got := string(appendPreimage(nil, execID, "tool_call", "read", readArgsHash, 0)); got != want {
		t.Errorf("preimage\n got %s\nwant %s", got, want)
	}
	// The step id is the SHA-256 of exactly that preimage.
	sum := sha256.Sum256([]byte(want))
	if got := StepID(execID, "tool_call", "read", readArgsHash, 0); got != hex.EncodeToString(sum[:]) {
		t.Errorf("StepID does not hash the preimage: %s", got)
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
	tests := []struct {
		name         string
		kind, target string
		args         string
		occ          int64
		want         string
	}{
		{"published occurrence 0", "tool_call", "read", readArgs, 0, "88aef972f184963cdb5e1d243d942762ba9614e8cc3ecb7874a2b94b058bce34"},
		{"published occurrence 1", "tool_call", "read", readArgs, 1, "f506dab25eaea86dc79b0cf5fc8be1bd3ad964e4545b259e955f55951dc3d3ff"},
		{"derived occurrence 2", "tool_call", "read", readArgs, 2, "c762bbc17c29013b5b3c3b09acec3f2cb0301054a0cc0c96f2b51a61281dca15"},
		{"derived llm", "llm_call", "gpt-4o", d13Args, 0, "8060242f6e479b475259b0816e96db25798e2dd06d55e6152332b3d4fc33cadd"},
		{"derived empty target", "llm_call", "", d13Args, 0, "efa779eb48a4e89e26328d187f0a1aa41c37cb070ed8915928c1e0c2cbfa4813"},
		{"derived local", "local", "fetch_page", `{}`, 0, "df001e5f1224dea94941171bd5c501bf59589f7c26a1a716ca6462778f936d4b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ArgsHashBytes([]byte(tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if got := StepID(execID, tt.kind, tt.target, h, tt.occ); got != tt.want {
				t.Errorf("StepID = %s, want %s", got, tt.want)
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

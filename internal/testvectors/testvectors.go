// Package testvectors reads the wire test vectors of docs/protocol/vectors,
// the one set that the Go, Python and TypeScript tests all check, so that
// the three implementations cannot drift apart. Only tests import it.
package testvectors

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// Canonical is one case of canonical-json.json.
type Canonical struct {
	Name         string `json:"name"`
	Args         string `json:"args"`
	CanonicalHex string `json:"canonical_hex"`
	ArgsHash     string `json:"args_hash"`
}

// Canonical returns the canonical form's bytes.
func (c Canonical) Canonical() []byte {
	b, err := hex.DecodeString(c.CanonicalHex)
	if err != nil {
		panic(fmt.Sprintf("vector %s: canonical_hex: %v", c.Name, err))
	}
	return b
}

// CanonicalFile is canonical-json.json.
type CanonicalFile struct {
	AbsentArgsHash string      `json:"absent_args_hash"`
	Cases          []Canonical `json:"cases"`
}

// StepID is one case of step-ids.json.
type StepID struct {
	Name       string `json:"name"`
	Kind       string `json:"kind"`
	Target     string `json:"target"`
	Args       string `json:"args"`
	ArgsHash   string `json:"args_hash"`
	Occurrence int64  `json:"occurrence"`
	Preimage   string `json:"preimage"`
	StepID     string `json:"step_id"`
}

// StepIDFile is step-ids.json.
type StepIDFile struct {
	ExecutionID string   `json:"execution_id"`
	Cases       []StepID `json:"cases"`
}

// Request is one v1 request signature of signatures.json. Absent dispatch
// headers are null in the file and empty strings here.
type Request struct {
	Name            string  `json:"name"`
	Secret          string  `json:"secret"`
	Method          string  `json:"method"`
	Target          string  `json:"target"`
	Timestamp       string  `json:"timestamp"`
	DispatchID      *string `json:"dispatch_id"`
	DispatchAttempt *string `json:"dispatch_attempt"`
	Body            string  `json:"body"`
	Message         string  `json:"message"`
	MessageLength   int     `json:"message_length"`
	Signature       string  `json:"signature"`
	LegacySignature string  `json:"legacy_signature"`
}

// DID is the Rebuno-Dispatch-Id value, or "" when the header is absent.
func (r Request) DID() string { return deref(r.DispatchID) }

// Attempt is the Rebuno-Dispatch-Attempt value, or "" when it is absent.
func (r Request) Attempt() string { return deref(r.DispatchAttempt) }

// Occurrence is one Rebuno-Occurrence-Signature vector of signatures.json.
type Occurrence struct {
	Secret           string `json:"secret"`
	RequestSignature string `json:"request_signature"`
	Occurrence       string `json:"occurrence"`
	Message          string `json:"message"`
	Signature        string `json:"signature"`
}

// SignatureFile is signatures.json.
type SignatureFile struct {
	Requests    []Request    `json:"requests"`
	Occurrences []Occurrence `json:"occurrences"`
}

// CarriedOutcome is one case of carried-outcomes.json: a carrier's body as
// the SDKs write it, and what it carries.
type CarriedOutcome struct {
	Name    string `json:"name"`
	Carrier string `json:"carrier"` // "submit", "complete" or "fail"
	Outcome struct {
		StepID    string `json:"step_id"`
		Succeeded bool   `json:"succeeded"`
		Value     string `json:"value"`
	} `json:"outcome"`
	Body string `json:"body"`
}

// CarriedOutcomeFile is carried-outcomes.json.
type CarriedOutcomeFile struct {
	Cases []CarriedOutcome `json:"cases"`
}

// LoadCarriedOutcomes reads carried-outcomes.json.
func LoadCarriedOutcomes() CarriedOutcomeFile {
	return load[CarriedOutcomeFile]("carried-outcomes.json")
}

// LoadCanonical reads canonical-json.json.
func LoadCanonical() CanonicalFile { return load[CanonicalFile]("canonical-json.json") }

// LoadStepIDs reads step-ids.json.
func LoadStepIDs() StepIDFile { return load[StepIDFile]("step-ids.json") }

// LoadSignatures reads signatures.json.
func LoadSignatures() SignatureFile { return load[SignatureFile]("signatures.json") }

// Dir is the vectors' directory in the repository.
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("testvectors: cannot locate the source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "protocol", "vectors")
}

func load[T any](name string) T {
	var v T
	data, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		panic(fmt.Sprintf("testvectors: %v", err))
	}
	if err := json.Unmarshal(data, &v); err != nil {
		panic(fmt.Sprintf("testvectors: %s: %v", name, err))
	}
	return v
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

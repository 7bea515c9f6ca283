package api

import (
	"bytes"
	"net"
	"regexp"
	"strconv"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/wire"
)

// Go's HTTP server answers a request it cannot parse (a control byte in a
// header, a malformed request line) itself, before any handler runs, with a
// plain-text body. Clients of this API branch on the JSON envelope, so the
// listener rewrites those answers. The server writes each of them with a
// single Write straight to the connection, in a shape no handler of ours can
// produce (every handler answer carries Rebuno-Request-Id and a length),
// which is what serverError matches. 431 keeps the server's own answer: the
// one documented exception to the envelope.

// serverError matches Go's own error answer: status line, then exactly these
// two headers, then the text.
var serverError = regexp.MustCompile(`^HTTP/1\.1 (4\d\d) ([^\r\n]*)\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n`)

// Listener wraps ln so that the HTTP server's own 4xx answers use the JSON
// error envelope.
func Listener(ln net.Listener) net.Listener { return envelopeListener{ln} }

type envelopeListener struct{ net.Listener }

func (l envelopeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &envelopeConn{Conn: c}, nil
}

type envelopeConn struct{ net.Conn }

func (c *envelopeConn) Write(b []byte) (int, error) {
	m := serverError.FindSubmatch(b)
	if m == nil || string(m[1]) == "431" {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(envelopeAnswer(m[1], m[2])); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets the server half-close the connection after an answer it
// sends before reading the request (431), as it does on a plain TCP
// connection; without it the client would see a reset instead of the answer.
func (c *envelopeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// envelopeAnswer is the server's answer with its status kept and the body in
// the envelope of docs/protocol/errors.md §1. Every such answer is about the request's syntax, so
// its code is validation_error.
func envelopeAnswer(code, reason []byte) []byte {
	text := "malformed request"
	// "Bad Request: malformed MIME header line" → keep what follows the
	// status text: it is the server's description of the problem.
	if _, detail, ok := bytes.Cut(reason, []byte(": ")); ok && len(detail) > 0 {
		text += ": " + string(detail)
	}
	body := append((&jsonx.Object{}).String("code", wire.CodeValidation).String("message", "validation error: "+text).Bytes(), '\n')
	var b bytes.Buffer
	b.WriteString("HTTP/1.1 " + string(code) + " ")
	reasonText, _, _ := bytes.Cut(reason, []byte(": "))
	b.Write(reasonText)
	b.WriteString("\r\nContent-Type: application/json; charset=utf-8\r\nConnection: close\r\n")
	b.WriteString(wire.HeaderRequestID + ": " + uuid.Must(uuid.NewV7()).String() + "\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	b.Write(body)
	return b.Bytes()
}

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/rebuno/rebuno/internal/wire"
)

// Client calls the kernel's HTTP API with a bearer token.
type Client struct {
	Base        string
	token       string
	tokenSource string
	timeout     time.Duration
	userAgent   string
	http        *http.Client
}

// NewClient returns a client of the kernel at base. tokenSource names where
// the token came from, for error hints.
func NewClient(base, token, tokenSource string, timeout time.Duration, version string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = timeout
	return &Client{Base: base, token: token, tokenSource: tokenSource, timeout: timeout,
		userAgent: "rebuno-cli/" + version, http: &http.Client{Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Response is a successful answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends one request and reads the whole answer. A non-2xx answer is an
// *APIError, a transport failure an *UnreachableError.
func (c *Client) Do(ctx context.Context, method, path string, body []byte) (*Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.send(ctx, method, path, body, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, c.apiError(method, path, resp, b)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// GetJSON GETs path and decodes the answer into v; it returns the raw body.
func (c *Client) GetJSON(ctx context.Context, path string, v any) ([]byte, error) {
	r, err := c.Do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if v != nil {
		if err := json.Unmarshal(r.Body, v); err != nil {
			return nil, c.badAnswer(path, r.Status, r.Body)
		}
	}
	return r.Body, nil
}

// Stream opens a long-lived GET (SSE). Only connecting and the response
// headers are bounded by the timeout; the caller closes the body.
func (c *Client) Stream(ctx context.Context, path string, header http.Header) (*http.Response, error) {
	resp, err := c.send(ctx, http.MethodGet, path, nil, header)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, c.apiError(http.MethodGet, path, resp, b)
	}
	return resp, nil
}

func (c *Client) send(ctx context.Context, method, path string, body []byte, header http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return nil, &UsageError{Msg: fmt.Sprintf("invalid request URL %q: %v", c.Base+path, err)}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", c.userAgent)
	if c.token != "" {
		req.Header.Set(wire.HeaderAuthorization, "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	return resp, nil
}

// ErrInterrupted is returned when the caller's context ends a request.
var ErrInterrupted = errors.New("interrupted")

func (c *Client) transportError(ctx context.Context, err error) error {
	if ctx.Err() == context.Canceled {
		return ErrInterrupted
	}
	cause := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		cause = ue.Err.Error()
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		cause = "connection refused"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		cause = fmt.Sprintf("no answer within %s (--timeout)", c.timeout)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		cause = "the connection was closed"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		cause = "unknown host " + dnsErr.Name
	}
	return &UnreachableError{URL: c.Base, Cause: cause,
		Hint: "start a kernel with `rebuno dev`, or point --url / " + EnvURL + " at a running one"}
}

// envelope is the error body of docs/protocol/errors.md §1.
type envelope struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

func (c *Client) apiError(method, path string, resp *http.Response, body []byte) error {
	var env envelope
	if json.Unmarshal(body, &env) != nil || env.Code == "" {
		return c.badAnswer(path, resp.StatusCode, body)
	}
	e := &APIError{Status: resp.StatusCode, Code: env.Code, Message: env.Message, Details: env.Details}
	switch env.Code {
	case wire.CodeUnauthorized:
		if c.token == "" {
			e.Hint = "this kernel requires a bearer token: pass --token or set " + EnvAPIKey +
				" to the value of the kernel's --bearer-token (REBUNO_BEARER_TOKEN)"
		} else {
			e.Hint = "the kernel refused the token from " + c.tokenSource +
				": it must equal the kernel's --bearer-token (REBUNO_BEARER_TOKEN)"
		}
	case wire.CodeNotFound:
		if env.Message == "route not found" {
			e.Hint = "the kernel has no such route: check that --url / " + EnvURL + " is the kernel's base URL, without a path"
		}
	case wire.CodeUnavailable:
		e.Hint = "the kernel is shutting down, overloaded or cannot reach its store; try again in a moment"
	}
	return e
}

// badAnswer describes an answer that is not the kernel's JSON: usually the
// URL points at something else.
func (c *Client) badAnswer(path string, status int, body []byte) error {
	snippet := strings.TrimSpace(string(body))
	if len(snippet) > 80 {
		snippet = snippet[:80] + "…"
	}
	msg := fmt.Sprintf("unexpected answer to %s: HTTP %d", path, status)
	if snippet != "" {
		msg += " " + fmt.Sprintf("%q", snippet)
	}
	return &APIError{Status: status, Code: "bad_response", Message: msg,
		Hint: "is " + c.Base + " a Rebuno kernel? Check --url / " + EnvURL}
}

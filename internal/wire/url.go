package wire

import "net/url"

// RedactURL hides the credentials of a URL (`https://user:pass@host/…`,
// `https://token@host/…`) for display and logs. A webhook URL may carry
// them; the kernel needs them to deliver, nobody needs to read them back.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	} else {
		// A lone user name is where many services put a token.
		u.User = url.User("xxxxx")
	}
	return u.String()
}

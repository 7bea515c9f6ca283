package postgres

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rebuno/rebuno/internal/store"
)

// The notifier carries store.Notifications between the replicas sharing a
// database over LISTEN/NOTIFY. A process hears its own notifications at
// once, in process; every notification also goes out on one channel, and
// each process ignores the echo of its own.
//
// Notify never waits for the database: it queues, and one goroutine sends
// everything queued in one statement, so a busy process sends in batches.
// A payload Postgres cannot carry (8,000 bytes or more, or not valid text)
// is stored in notification_payloads and the notification names its row;
// receivers read it from there. A live delta of 7,000 bytes of text grows
// past the limit once escaped as JSON, so this route is taken in practice.
//
// Notifications are best effort, as the store.Notifier contract says: one
// lost to a full queue or a broken connection only delays work until the
// next poll. The listening connection is re-established when it breaks.

const (
	channel = "rebuno"
	// maxPayload is Postgres's limit: a payload must be shorter.
	maxPayload = 8000
	// queueSize bounds what waits to be sent; beyond it notifications are
	// dropped and counted.
	queueSize = 8192
	// maxBatch bounds one statement.
	maxBatch = 512
	// payloadLifetime is how long a stored payload is kept for receivers
	// to read; payloadSweep is how often a sender deletes older ones.
	payloadLifetime = time.Minute
	payloadSweep    = 10 * time.Second
	// sendTimeout bounds one batch; fetchTimeout one payload read.
	sendTimeout  = 5 * time.Second
	fetchTimeout = 2 * time.Second
)

// Reconnection backoff of the dedicated connections.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

type notifier struct {
	local  store.LocalNotifier
	origin string
	queue  chan store.Notification
	pool   *pgxpool.Pool
	cfg    *pgx.ConnConfig
	log    *slog.Logger
	// conn is the listening connection while it is up; only the receiving
	// goroutine uses it once listen has returned.
	conn      *pgx.Conn
	dropped   atomic.Int64
	lastSweep time.Time
}

func newNotifier(pool *pgxpool.Pool, cfg *pgx.ConnConfig, log *slog.Logger) *notifier {
	return &notifier{origin: uuid.NewString(), queue: make(chan store.Notification, queueSize), pool: pool, cfg: cfg, log: log}
}

// Notify implements store.Notifier.
func (n *notifier) Notify(msg store.Notification) {
	n.local.Notify(msg)
	select {
	case n.queue <- msg:
	default:
		if n.dropped.Add(1)%1000 == 1 {
			n.log.Warn("notification queue full; dropping notifications (waiters fall back to polling)",
				slog.Int64("dropped", n.dropped.Load()))
		}
	}
}

// Listen implements store.Notifier.
func (n *notifier) Listen(fn func(store.Notification)) { n.local.Listen(fn) }

// encode lays a notification out as the payload other processes parse:
// origin, topic and key on lines of their own, then '=' and the data, or
// '@' and the id of the row holding it (ref).
func (n *notifier) encode(msg store.Notification, ref string) string {
	var b strings.Builder
	b.Grow(len(n.origin) + len(msg.Topic) + len(msg.Key) + len(msg.Data) + 4)
	b.WriteString(n.origin)
	b.WriteByte('\n')
	b.WriteString(msg.Topic)
	b.WriteByte('\n')
	b.WriteString(msg.Key)
	b.WriteByte('\n')
	if ref != "" {
		b.WriteByte('@')
		b.WriteString(ref)
	} else {
		b.WriteByte('=')
		b.Write(msg.Data)
	}
	return b.String()
}

// decode parses a payload; ref is set when the data is in a row.
func decode(payload string) (origin string, msg store.Notification, ref string, ok bool) {
	parts := strings.SplitN(payload, "\n", 4)
	if len(parts) != 4 || parts[3] == "" {
		return "", msg, "", false
	}
	msg.Topic, msg.Key = parts[1], parts[2]
	switch body := parts[3]; body[0] {
	case '=':
		msg.Data = []byte(body[1:])
	case '@':
		ref = body[1:]
	default:
		return "", msg, "", false
	}
	return parts[0], msg, ref, true
}

// carried reports whether Postgres can carry payload as a NOTIFY payload.
func carried(payload string) bool {
	return len(payload) < maxPayload && utf8.ValidString(payload) && !strings.ContainsRune(payload, 0)
}

// send sends what is queued until ctx ends, then what is still queued.
func (n *notifier) send(ctx context.Context) {
	batch := make([]store.Notification, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case msg := <-n.queue:
			batch = append(batch, msg)
		case <-ctx.Done():
			n.flush()
			return
		}
		batch = n.drain(batch)
		sendCtx, cancel := context.WithTimeout(ctx, sendTimeout)
		if err := n.sendBatch(sendCtx, batch); err != nil && ctx.Err() == nil {
			n.log.Warn("could not send notifications to the other replicas", slog.Int("count", len(batch)), slog.Any("error", err))
		}
		cancel()
	}
}

// drain adds to batch what is queued, without waiting.
func (n *notifier) drain(batch []store.Notification) []store.Notification {
	for len(batch) < maxBatch {
		select {
		case msg := <-n.queue:
			batch = append(batch, msg)
		default:
			return batch
		}
	}
	return batch
}

// flush sends what is queued at Close, briefly.
func (n *notifier) flush() {
	batch := n.drain(nil)
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n.sendBatch(ctx, batch)
}

// sendBatch sends notifications in one statement, in order; the same wake-up
// twice (events of one execution, dispatch) goes once. Payloads that need a
// row are written in the same transaction, so a receiver finds the row.
func (n *notifier) sendBatch(ctx context.Context, batch []store.Notification) error {
	type wake struct{ topic, key string }
	seen := map[wake]bool{}
	var payloads, ids []string
	var datas [][]byte
	for _, msg := range batch {
		if msg.Topic != store.TopicDelta {
			w := wake{msg.Topic, msg.Key}
			if seen[w] {
				continue
			}
			seen[w] = true
		}
		p := n.encode(msg, "")
		if !carried(p) {
			id := uuid.NewString()
			ids, datas = append(ids, id), append(datas, msg.Data)
			p = n.encode(msg, id)
		}
		payloads = append(payloads, p)
	}
	const notify = `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`
	if len(ids) == 0 {
		_, err := n.pool.Exec(ctx, notify, channel, payloads)
		return err
	}
	now := time.Now()
	sweep := now.Sub(n.lastSweep) >= payloadSweep
	err := pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
		if sweep {
			if _, err := tx.Exec(ctx, `DELETE FROM notification_payloads WHERE created_at < $1`, now.Add(-payloadLifetime).UnixMicro()); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO notification_payloads (id, data, created_at)
 SELECT id, data, $3 FROM unnest($1::text[], $2::bytea[]) AS u(id, data)`, ids, datas, now.UnixMicro()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, notify, channel, payloads)
		return err
	})
	if err == nil && sweep {
		n.lastSweep = now
	}
	return err
}

// listen opens the listening connection.
func (n *notifier) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, n.cfg)
	if err != nil {
		return classify(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return classify(err)
	}
	n.conn = conn
	return nil
}

// receive hands every notification from another process to the listeners
// until ctx ends, listening again whenever the connection breaks. What was
// sent while it was down is lost, so after listening again it raises
// store.TopicResync: dispatchers look for due work, and event streams and
// delta consumers re-read the store, at once.
func (n *notifier) receive(ctx context.Context) {
	wait := retryMin
	for {
		if n.conn == nil {
			if err := n.listen(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				n.log.Warn("cannot listen for notifications from the other replicas; retrying", slog.Any("error", err))
				if !sleep(ctx, wait) {
					return
				}
				wait = min(2*wait, retryMax)
				continue
			}
			wait = retryMin
			n.log.Info("listening for notifications from the other replicas again")
			n.local.Notify(store.Notification{Topic: store.TopicResync})
		}
		note, err := n.conn.WaitForNotification(ctx)
		if err != nil {
			n.conn.Close(context.Background())
			n.conn = nil
			if ctx.Err() != nil {
				return
			}
			n.log.Warn("lost the connection that listens for notifications", slog.Any("error", err))
			continue
		}
		n.hear(ctx, note.Payload)
	}
}

// hear delivers one payload from the channel, unless this process sent it.
func (n *notifier) hear(ctx context.Context, payload string) {
	origin, msg, ref, ok := decode(payload)
	if !ok || origin == n.origin {
		return
	}
	if ref != "" {
		fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
		err := n.pool.QueryRow(fctx, `SELECT data FROM notification_payloads WHERE id = $1`, ref).Scan(&msg.Data)
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				n.log.Warn("could not read a notification's payload", slog.String("topic", msg.Topic), slog.Any("error", err))
			}
			return
		}
	}
	n.local.Notify(msg)
}

// sleep waits for d or the end of ctx; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

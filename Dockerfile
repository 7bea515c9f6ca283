# The Rebuno kernel as a container image: one static binary on a distroless
# base, run as an unprivileged user. `rebuno server` is the default command;
# configure it with REBUNO_* variables (docs/deploy.md).
#
#   docker build -t rebuno --build-arg VERSION=$(git describe --tags --always) .
#
# The SQLite driver is pure Go, so the binary needs no C library: rebuno dev
# works in the same image (give it a writable --db path).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd ./cmd
COPY internal ./internal
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/rebuno ./cmd/rebuno

# Static: CA certificates (for https webhooks) and time zones, no shell, and
# the nonroot user (uid 65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rebuno /usr/local/bin/rebuno
USER nonroot:nonroot
WORKDIR /home/nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rebuno"]
CMD ["server"]

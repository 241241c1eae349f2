module github.com/taskgate/workers/examples/durable

go 1.26.0

require (
	github.com/taskgate/workers v0.0.0
	github.com/taskgate/workers/sqlstore v0.0.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	golang.org/x/sys v0.49.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

// The replace directives build against this repository's own modules. A
// release tags the root module and this one together and requires the
// tagged version, since a dependency's replace directives are ignored.
replace (
	github.com/taskgate/workers => ../..
	github.com/taskgate/workers/sqlstore => ../../sqlstore
)

module github.com/taskgate/workers/workershttp/browsertest

go 1.26.0

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/taskgate/workers v0.0.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

// The replace directive builds against this repository's root module;
// this module only holds the browser test, and is never released.
replace github.com/taskgate/workers => ../..

// Package browsertest drives the workershttp dashboard in a real headless
// Chromium. It holds only tests, in a module of its own so that the root
// module does not depend on the DevTools client.
//
// The test looks for Chromium in $WORKERS_TEST_CHROMIUM, then
// /usr/bin/chromium, and skips with a message when there is none; on
// Debian, `apt-get install chromium` provides it.
package browsertest

//go:build unix

package bench

import (
	"os"
	"syscall"
	"testing"
)

// BenchmarkHostFreshPage measures the machine, not a library: the time
// to write the first byte of a page of memory this process never
// touched, which the kernel must find and clear (and, in a virtual
// machine whose host takes back the memory a guest frees, the host must
// back first). Each op is one page. Benchmarks whose heap grows, as a
// store that keeps every record does and a pool that keeps none does
// not, pay it for every page they add; read their ratios beside it.
func BenchmarkHostFreshPage(b *testing.B) {
	const chunk = 64 << 20
	page := os.Getpagesize()
	for done := 0; done < b.N; {
		b.StopTimer()
		m, err := syscall.Mmap(-1, 0, chunk, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			b.Fatal(err)
		}
		n := min(b.N-done, chunk/page)
		b.StartTimer()
		for i := range n {
			m[i*page] = 1
		}
		b.StopTimer()
		if err := syscall.Munmap(m); err != nil {
			b.Fatal(err)
		}
		done += n
		b.StartTimer()
	}
}

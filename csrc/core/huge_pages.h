// Transparent huge pages for large freshly allocated outputs.
//
// glibc serves allocations above its mmap threshold (at most 32 MiB on 64-bit Linux) with a
// fresh mmap and unmaps them on free, so every call that returns such an output pays one
// page fault per 4 KiB page it writes (a 37 MiB SpMM output: ~9.5k faults, more system time
// than the product itself). Advising the 2 MiB-aligned interior of the buffer MADV_HUGEPAGE
// before it is first written lets the kernel back it with 2 MiB pages (512x fewer faults).
// Only the buffers sparsejit allocates are advised, only above the threshold, and only where
// the OS runs THP in "always" or "madvise" mode; nothing else in the process changes.
//
// SPARSEJIT_HUGE_PAGES: unset -> default threshold (32 MiB); 0 -> off; N -> threshold N MiB.
#pragma once

#include <cstddef>

namespace sparsejit {

// Bytes from which outputs are advised; 0 when off (by the variable or the OS setting).
std::size_t huge_page_threshold();
// Changes it for the rest of the process (0: off; stays 0 where the OS runs THP "never");
// returns the previous value. For benchmarks and applications that know their sizes.
std::size_t set_huge_page_threshold(std::size_t bytes);

// Advise [p, p + bytes) if bytes >= huge_page_threshold(); returns whether it did. Safe on
// any pointer (the call only affects whole 2 MiB pages inside the range).
bool advise_huge_pages(void* p, std::size_t bytes);

}  // namespace sparsejit

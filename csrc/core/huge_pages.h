// Transparent huge pages for large freshly allocated outputs.
//
// A large output whose memory no one has written yet faults in one 4 KiB page at a time as the
// op writes it. glibc serves allocations above its mmap threshold (at most 32 MiB on 64-bit
// Linux) with a fresh mmap every call; below it, a buffer freed at the top of the heap is often
// trimmed and its pages faulted in again by the next allocation (a network's layer outputs at
// batch 8: 16-33k faults per ResNet-50 forward). Advising such memory MADV_HUGEPAGE before it
// is first written lets the kernel back it with 2 MiB pages (512x fewer faults).
//
// Only the 2 MiB pages inside the buffer none of whose 4 KiB pages is resident yet (mincore)
// are advised: memory glibc recycles is already backed, has no faults left to save, and is left
// as it is. Only buffers sparsejit allocates, only from the threshold up, and only where the
// OS runs THP in "always" or "madvise" mode; nothing else in the process changes.
//
// SPARSEJIT_HUGE_PAGES: unset -> default threshold (4 MiB); 0 -> off; N -> threshold N MiB.
#pragma once

#include <cstddef>

namespace sparsejit {

// Bytes from which outputs are advised; 0 when off (by the variable or the OS setting).
std::size_t huge_page_threshold();
// Changes it for the rest of the process (0: off; stays 0 where the OS runs THP "never");
// returns the previous value. For benchmarks and applications that know their sizes.
std::size_t set_huge_page_threshold(std::size_t bytes);

// If bytes >= huge_page_threshold(), advises the whole 2 MiB pages inside [p, p + bytes) that
// hold no resident page; returns whether it advised any. Safe on any pointer (the call only
// affects whole 2 MiB pages inside the range; an unmapped range is refused by the OS).
bool advise_huge_pages(void* p, std::size_t bytes);

}  // namespace sparsejit

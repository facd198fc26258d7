// Process-wide allocator settings for the programs that move requests (server, load tester, fake
// server). Call once at the top of main, before any thread starts.
#pragma once

namespace drafthead {

// Keeps request-sized buffers (a 64-row request's hidden rows are 640 KB; a FULL_LOGITS answer
// megabytes) in the heap instead of glibc's fresh mmap pages a call, and keeps freed memory there:
// ~125 page faults a 64-row call otherwise (docs/NOTES.md, session 18). The heap then stays at the
// peak of what was in flight at once, which the queue limits bound. A no-op off glibc.
void KeepRequestBuffersInHeap();

}  // namespace drafthead

#include "base/segment_map.h"
/* The map itself; see segment_map.h. */
uintptr_t lull_segment_map[LULL_SEGMAP_ENTRIES];

/* Page-aligned, like a segment: its span descriptors sit on their lines.
 * Not const: zero bytes in .bss cost nothing, in .rodata a page each.
 * Never written, so never resident beyond the zero page. */
_Alignas(4096) uint8_t lull_segment_stand_in[LULL_META_SLICES * LULL_SLICE_SIZE];
_Static_assert(LULL_META_END <= sizeof lull_segment_stand_in, "the stand-in holds all metadata");

_Atomic uint64_t lull_aligned_huge_map[LULL_SEGMAP_WORDS];

/* The entry points that allocate (the malloc family, the C++ operator
 * new forms and their helpers) are placed in a section of their own, so
 * that the heap profile tells their frames from the program's when it
 * takes a stack (src/profile.c), whether lull is a shared object or linked
 * into the program. The linker defines the section's bounds. */
#ifndef LULL_ENTRY_TEXT_H
#define LULL_ENTRY_TEXT_H

#define LULL_ENTRY_TEXT __attribute__((section("lull_entry_text")))

extern const char __start_lull_entry_text[] __attribute__((visibility("hidden")));
extern const char __stop_lull_entry_text[] __attribute__((visibility("hidden")));

#endif

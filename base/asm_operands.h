/* LULL_ASM_OPERANDS: 1 where the hot paths may state a test in x86-64
 * assembly with a flag output (gcc's and clang's `=@cc`), 0 elsewhere.
 * gcc loads an atomic into a register before it uses it, where the
 * instruction could take it as its memory operand, and cannot know facts
 * about the values that make a shorter test valid; each use says which
 * instructions it saves. A relaxed load of an aligned word is a plain load
 * on x86-64, so the operand reads what the atomic load would. Sanitizer
 * builds use the plain C, which they can see. */
#ifndef LULL_ASM_OPERANDS_H
#define LULL_ASM_OPERANDS_H

#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(__SANITIZE_ADDRESS__) &&  \
    !defined(__SANITIZE_THREAD__)
#define LULL_ASM_OPERANDS 1
#else
#define LULL_ASM_OPERANDS 0
#endif

#endif

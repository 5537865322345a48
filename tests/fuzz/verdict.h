/* verdict.h: what each fuzz target gives the replay (replay.c) besides
 * LLVMFuzzerTestOneInput, so that the replay can check that a file meant
 * to be rejected is rejected, with its code (tests/fuzz/verdicts.txt). */
#ifndef SLUICE_FUZZ_VERDICT_H
#define SLUICE_FUZZ_VERDICT_H

#include <stddef.h>
#include <stdint.h>

/* The target's name in verdicts.txt: header, index, manifest, model,
 * signature. */
extern const char fuzz_target_name[];

/* Runs the target on one input, as LLVMFuzzerTestOneInput does, and
 * returns SLUICE_OK when the input was accepted, else the status that
 * rejected it. */
int fuzz_verdict(const uint8_t *data, size_t size);

#endif

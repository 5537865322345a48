/* jsonout.h: writing JSON strings with every byte escaped correctly
 * (tensor names may hold quotes, control characters, even NUL). */
#ifndef SLUICE_JSONOUT_H
#define SLUICE_JSONOUT_H

#include <stddef.h>
#include <stdio.h>

/* Writes s[0..len) as a quoted JSON string. */
void json_string(FILE *out, const char *s, size_t len);

#endif

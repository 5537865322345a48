/* version.c: which library is running. The header's macros tell what a
 * program was compiled against; these calls tell what it loaded, which
 * differs when an older or newer libsluice.so.0 is found at run time. */
#include "sluice.h"

SLUICE_API const char *sluice_version(void)
{
    return SLUICE_VERSION_STRING;
}

SLUICE_API int sluice_version_number(void)
{
    return SLUICE_VERSION_NUMBER;
}

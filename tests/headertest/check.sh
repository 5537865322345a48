#!/bin/sh
# The public header alone must compile as strict C99 and as C++.
# usage: check.sh INCLUDE_DIR C_COMPILER [CXX_COMPILER]
set -eu
inc=$1 cc=$2 cxx=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The info initializers must compile warning-free in both languages too.
cat > "$work/t.c" <<'EOF'
#include <sluice.h>
int main(void)
{
    sluice_options o;
    struct sluice_tensor_info ti = SLUICE_TENSOR_INFO_INIT;
    struct sluice_file_info fi = SLUICE_FILE_INFO_INIT;
    return sluice_options_init(&o) + (int)(ti.size + fi.size) + SLUICE_VERSION_NUMBER;
}
EOF
"$cc" -std=c99 -pedantic -Werror -Wall -Wextra -I"$inc" -c "$work/t.c" -o "$work/t.o"
"$cc" -std=c11 -pedantic -Werror -Wall -Wextra -I"$inc" -c "$work/t.c" -o "$work/t.o"
if [ -n "$cxx" ]; then
    cp "$work/t.c" "$work/t.cpp"
    "$cxx" -std=c++11 -pedantic -Werror -Wall -Wextra -I"$inc" -c "$work/t.cpp" -o "$work/t.o"
    "$cxx" -std=c++17 -pedantic -Werror -Wall -Wextra -I"$inc" -c "$work/t.cpp" -o "$work/t.o"
    echo "header test: C99, C11, C++11, C++17: ok"
else
    echo "no C++ compiler found" >&2
    exit 1
fi

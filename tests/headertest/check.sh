#!/bin/sh
# The public header alone must compile as strict C99 and as C++.
# usage: check.sh INCLUDE_DIR C_COMPILER [CXX_COMPILER]
set -eu
inc=$1 cc=$2 cxx=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <sluice.h>\nint main(void) { sluice_options o; return sluice_options_init(&o); }\n' > "$work/t.c"
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

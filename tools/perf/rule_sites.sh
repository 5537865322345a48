#!/bin/bash
# The places in src/ (and the Python extension) that decide each rule issue
# 37 names, by git grep at a revision, for the before/after counts of its
# closing note:   tools/perf/rule_sites.sh REV [REV ...]
# Each rule prints its grep's lines and their count. A count of lines is a
# count of places only as far as the grep goes: the note reads them (which
# line decides and which only asks or acts), so keep the lines with it.
set -u
[ $# -ge 1 ] || { sed -n 2,7p "$0"; exit 2; }
cd "$(git rev-parse --show-toplevel)" || exit 2
# definitions start in column 0 and calls are indented; comments dropped
calls() { grep -vE '^[^:]+:[^:]+:[0-9]+:([A-Za-z_]|\s*(\*(\s|/|$)|/\*|//))'; }
rule() { # title, then the git grep arguments
    local title=$1; shift
    local out; out=$(git grep -nE "$@" | grep -vE '^[^:]+:[^:]+:[0-9]+:\s*(\*(\s|/|$)|/\*|//)')
    printf '### %s: %d\n' "$title" "$(printf '%s' "$out" | grep -c .)"
    printf '%s\n' "$out" | sed 's/^/    /' | cut -c1-200
}
for rev in "$@"; do
    echo "## $rev ($(git log -1 --format=%h "$rev"))"
    rule "direct retry: a checksum failure of bytes that came through the proxy sends the read to the origin directly (the decision)" \
        'SLUICE_E_CHECKSUM.*(proxied|px_used|through_proxy)|(proxied|px_used|through_proxy).*SLUICE_E_CHECKSUM|sl_source_proxied\([^)]*\) *&&' "$rev" -- src
    rule "direct retry: copies of the remote configuration without its proxy (the read again)" \
        'proxy_http = [a-z_.]*proxy_https = NULL' "$rev" -- src
    rule "direct retry: transport failures through the proxy sent direct (remote.c's fetch; one rule, not the checksum one)" \
        '\bproxy_fault\(' "$rev" -- src
    echo "### location: calls of the functions that split a location string (definitions and headers left out)"
    out=$(git grep -nE '\b(url_host|on_hub|sl_hf_on_hub|sl_hf_token_for|sl_remote_shown|remote_name_len|sl_location_networked|sl_source_for|sl_location_path_len|sl_location_shown|sl_location_shown_of|sl_location_host_of|sl_location_name_len_of|sl_location_new|sl_hf_parse)\(' "$rev" -- src | grep -v '\.h:' | calls)
    for fn in sl_location_new sl_hf_parse url_host on_hub sl_hf_on_hub sl_hf_token_for sl_remote_shown remote_name_len sl_location_networked sl_source_for sl_location_path_len sl_location_shown sl_location_shown_of sl_location_host_of sl_location_name_len_of; do
        n=$(printf '%s\n' "$out" | grep -cE "\b$fn\(")
        [ "$n" -gt 0 ] && printf '    %s: %d\n' "$fn" "$n"
    done
    printf '    total: %d (of which sl_location_new, the parse at open: %d)\n' \
        "$(printf '%s' "$out" | grep -c .)" "$(printf '%s\n' "$out" | grep -cE '\bsl_location_new\(')"
    printf '%s\n' "$out" | sed 's/^/      /' | cut -c1-200
    rule "remote fails closed: trust code that tests whether the model or manifest is remote" \
        'sl_location_networked\(|sl_location_remote\(|sl_trust_remote_model\(|strncmp\([^,]+, "(https?|s3|hf)://"' "$rev" -- \
        src/signature.c src/model_signing_open.c src/manifest.c 'src/trust/*.c'
    rule "remote fails closed: SLUICE_E_SIGNATURE messages for a remote signature not fetched or missing" \
        'not fetched|(remote (model|manifest).*(has )?none beside|has no signature beside)' "$rev" -- src
    rule "signature format: which format (Ed25519 M.sig or OpenSSF model.sig) a manifest is checked by" \
        'sl_ms_applies\(|sl_sig_key_is_ec\(|sl_trust_plan_format\(|bundle_if_present *=|formats *(\|)?= *SL_SIG' "$rev" -- src
    rule "manifest source: where the manifest comes from (manifest_path or sidecar; local or remote; the Hub's stand-in)" \
        '(if \(|\? |&& |\|\| |!)(o->|opts->|m->opts\.|opts\.)manifest_path\b|->from *= |hub_digest *= ' "$rev" -- src
    rule "manifest source: the Hub's digests standing in for a manifest (where chosen)" \
        'hub_manifest\(|sl_hub_open\w*\(|m->hub && !o->manifest_path' "$rev" -- 'src/*.c'
    rule "manifest loaders: functions that load a model's manifest (definitions)" \
        '^(static )?int (sl_manifest_load|load_remote_manifest|load_remote|find_local|sl_hub_open\w*)\(' "$rev" -- 'src/*.c'
    rule "verify paths: entry points of sluice_verify's work (definitions)" \
        '^(static )?int (sl_verify_run|sl_verify_remote_files|remote_verify)\(' "$rev" -- 'src/*.c'
    rule "verify paths: places that compare a whole item's digest with the manifest's" \
        'memcmp\([a-z_>.-]*(want|digest)[^,]*, [a-z_>.-]*(want|digest)' "$rev" -- src/verify.c src/api/verify.c
    rule "acquire in the Python extension: calls of sluice_acquire*" \
        'sluice_acquire\w*\(' "$rev" -- bindings/python/src
    echo "### acquire in the Python extension: functions that call sluice_acquire* (git grep -p: the function of each call)"
    out=$(git grep -p -nE 'sluice_acquire\w*\(' "$rev" -- bindings/python/src | grep -E '^[^:]+:[^:=]+=[0-9]+=')
    printf '    functions: %d\n' "$(printf '%s' "$out" | grep -c .)"
    printf '%s\n' "$out" | sed 's/^/      /' | cut -c1-200
    echo
done

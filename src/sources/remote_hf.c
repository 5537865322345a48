/* remote_hf.c: Hugging Face Hub locations, hf://ORG/NAME[@REVISION][/FILE],
 * as remote.c reaches them (remote.h): the Hub's resolve URL of a file,
 * the Hub's endpoint and token, and which requests carry that token.
 *
 * An hf:// location is a URL like s3:// is one: remote.c maps it to
 * ENDPOINT/ORG/NAME/resolve/REVISION/FILE (REVISION "main" when none is
 * given) and reads it with the same range requests. The Hub answers a
 * resolve of a large (LFS) file with a 302 to its storage (a CDN, a
 * presigned bucket URL): libcurl follows it, and sends the Authorization
 * header only to the host, port and scheme of the first request (it
 * would send it on with CURLOPT_UNRESTRICTED_AUTH, which remote.c never
 * sets), so the token never reaches the storage. The revision is pinned
 * to a commit by hf.c before any file is opened. */
#include "sources/remote.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

int sl_hf_cfg_fill(sl_remote_cfg *c, const sluice_options *o)
{
    const char *ep = env_or_null("HF_ENDPOINT");
    /* the explicit option first, then the Hub's own variable; never
     * SLUICE_HTTP_TOKEN, which is meant for the caller's own servers */
    const char *tok = o->http_token && *o->http_token ? o->http_token : env_or_null("HF_TOKEN");
    if (!ep)
        ep = "https://huggingface.co";
    /* written as the parser reads a URL (location.c: a lowercase http:// or
     * https://), since which requests are the Hub's is read from the parts
     * (sl_hf_on_hub) of URLs made from this text: its scheme lowercased
     * ("HTTPS://" is https:// to libcurl), and one without a scheme given
     * libcurl's guess, http:// (else the API's requests would be no URL of
     * the endpoint, and go out with the caller's own token) */
    const char *sep = strstr(ep, "://");
    size_t skip = sep ? (size_t)(sep - ep) + 3 : 0;
    if (!(c->hf_endpoint = malloc(strlen(ep) + 8)))
        return -1;
    if (sep) {
        for (size_t i = 0; i < skip; i++)
            c->hf_endpoint[i] = (char)tolower((unsigned char)ep[i]);
        strcpy(c->hf_endpoint + skip, ep + skip);
    } else {
        strcpy(c->hf_endpoint, "http://");
        strcat(c->hf_endpoint, ep);
    }
    size_t n = strlen(c->hf_endpoint);
    while (n > 0 && c->hf_endpoint[n - 1] == '/')
        c->hf_endpoint[--n] = '\0';
    if (tok && !(c->hf_token = strdup(tok)))
        return -1;
    /* parsed once: which locations are the Hub's is read from the parts */
    return (c->hf_endpoint_loc = sl_location_new(c->hf_endpoint)) ? 0 : -1;
}

/* Replaces *slot (wiped) by a copy of the variable's value, or NULL. */
static int retoken(char **slot, const char *var)
{
    if (*slot)
        memset(*slot, 0, strlen(*slot));
    free(*slot);
    const char *v = env_or_null(var);
    *slot = v ? strdup(v) : NULL;
    return v && !*slot ? -1 : 0;
}

/* Whether a token holds a byte that would end or split its header line. */
static int bad_token(const char *t)
{
    for (; t && *t; t++)
        if ((unsigned char)*t < 0x20 || *t == 0x7f)
            return 1;
    return 0;
}

int sl_hf_cfg_tokens(sl_remote_cfg *c, const sluice_options *o, const sl_location *primary,
                     sl_location *const *mirrors, size_t nmirrors, int *hub, sl_err *err)
{
    /* http_token is the primary's: the Hub's for an hf:// model (its
     * other hosts, mirrors, get $SLUICE_HTTP_TOKEN only), else the
     * caller's own servers' (the Hub, an hf:// mirror, gets $HF_TOKEN) */
    if (o->http_token && *o->http_token &&
        (sl_hf_on_hub(c, primary) ? retoken(&c->token, "SLUICE_HTTP_TOKEN")
                                     : retoken(&c->hf_token, "HF_TOKEN")) < 0)
        return sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
    /* a line break in a token would end its "Authorization:" line and
     * start a header (or the body) of the token's choosing */
    if (bad_token(c->token) || bad_token(c->hf_token))
        return sl_fail(err, SLUICE_E_INVAL, "remote: the %s token (http_token, %s) holds a "
                       "control character (a line break?), which no HTTP header can carry",
                       bad_token(c->token) ? "HTTP" : "Hub's",
                       bad_token(c->token) ? "else $SLUICE_HTTP_TOKEN" : "else $HF_TOKEN");
    /* the Hub's token travels only to the Hub: it counts as a credential
     * of the Dragonfly hop only when the model or a mirror is there */
    *hub = sl_hf_on_hub(c, primary);
    for (size_t k = 0; !*hub && k < nmirrors; k++)
        *hub = sl_hf_on_hub(c, mirrors[k]);
    /* the endpoint is asked only for the Hub's locations: its port is
     * checked by the locations' rule where one is */
    return *hub ? sl_location_check(c->hf_endpoint_loc, "$HF_ENDPOINT", err) : SLUICE_OK;
}

void sl_hf_cfg_clear(sl_remote_cfg *c)
{
    if (c->hf_token)
        memset(c->hf_token, 0, strlen(c->hf_token));
    free(c->hf_token);
    free(c->hf_endpoint);
    sl_location_free(c->hf_endpoint_loc);
    c->hf_token = c->hf_endpoint = NULL;
    c->hf_endpoint_loc = NULL;
}

int sl_hf_parse(const char *loc, sl_hf_loc *out)
{
    memset(out, 0, sizeof *out);
    /* no query or fragment: nothing reads one, and a "?revision=v2"
     * dropped would open another revision than meant */
    if (strncmp(loc, "hf://", 5) != 0 || strpbrk(loc, "?#"))
        return -1;
    const char *org = loc + 5, *slash = strchr(org, '/');
    if (!slash || slash == org)
        return -1;
    const char *name = slash + 1;
    size_t nl = strcspn(name, "@/?#");
    if (nl == 0)
        return -1;
    out->repo = org;
    out->repo_len = (size_t)(name + nl - org);
    const char *p = name + nl;
    if (*p == '@') {
        out->rev = p + 1;
        out->rev_len = strcspn(out->rev, "/?#");
        if (out->rev_len == 0)
            return -1;
        p = out->rev + out->rev_len;
    }
    if (*p == '/' && p[1] && p[1] != '?' && p[1] != '#') {
        out->file = p + 1;
        out->file_len = strcspn(out->file, "?#");
        while (out->file_len > 0 && out->file[out->file_len - 1] == '/')
            out->file_len--;
    }
    /* what names the repository is plain: no "..", no empty part, no space */
    for (size_t i = 0; i < out->repo_len; i++)
        if (out->repo[i] <= ' ' || out->repo[i] == '\\')
            return -1;
    return strstr(loc, "..") ? -1 : 0;
}

/* Whether byte b of a FILE goes into the URL %-encoded: controls, space,
 * non-ASCII, what RFC 3986 does not allow in a path, and '%' itself ('/'
 * stays: a FILE may be in a folder). FILE is a file name as the Hub lists
 * it (its rfilename, a weight_map value), never a URL: a '%' left as it
 * is would be decoded by the Hub, and a shard named "%2e%2e%2f..." would
 * reach another path, another repository's files even. */
static int needs_escape(unsigned char b)
{
    return b <= 0x20 || b >= 0x7f || strchr("\"<>\\^`{|}%", b) != NULL;
}

char *sl_hf_url(const sl_remote_cfg *c, const char *loc, sl_err *err)
{
    sl_hf_loc h;
    if (sl_hf_parse(loc, &h) < 0) {
        sl_fail(err, SLUICE_E_INVAL, "%s: not a Hub location (hf://ORG/NAME[@REVISION][/FILE])",
                loc);
        return NULL;
    }
    size_t n = strlen(c->hf_endpoint) + h.repo_len + h.rev_len + 3 * h.file_len + 32;
    char *u = malloc(n);
    if (!u) {
        sl_fail(err, SLUICE_E_NOMEM, "remote: out of memory");
        return NULL;
    }
    int k = snprintf(u, n, "%s/%.*s/resolve/%.*s%s", c->hf_endpoint, (int)h.repo_len, h.repo,
                     h.rev ? (int)h.rev_len : 4, h.rev ? h.rev : "main", h.file ? "/" : "");
    for (size_t i = 0; i < h.file_len; i++) {
        unsigned char b = (unsigned char)h.file[i];
        k += snprintf(u + k, n - (size_t)k, needs_escape(b) ? "%%%02X" : "%c", b);
    }
    return u;
}

/* Whether a and b have the same user information (user:password@), or
 * both none: an endpoint written with it (a mirror of the Hub behind basic
 * auth) is reached by URLs made from its text, which carry it. */
static int same_userinfo(const sl_location *a, const sl_location *b)
{
    return !a->userinfo || !b->userinfo ? a->userinfo == b->userinfo
                                        : strcmp(a->userinfo, b->userinfo) == 0;
}

int sl_hf_on_hub(const sl_remote_cfg *c, const sl_location *loc)
{
    if (!loc)
        return 0;
    if (loc->kind == SL_LOC_HUB)
        return 1;
    /* a URL of the endpoint: what a prefix of the endpoint's text followed
     * by '/' or the end matched, read from the parts */
    const sl_location *ep = c ? c->hf_endpoint_loc : NULL;
    if (!ep || ep->kind != SL_LOC_HTTP || loc->kind != SL_LOC_HTTP ||
        !same_userinfo(loc, ep) || ep->query || ep->name_len != strlen(ep->given) ||
        strcmp(loc->scheme, ep->scheme) != 0 || strcmp(loc->host, ep->host) != 0 ||
        loc->port != ep->port)
        return 0;
    size_t n = strlen(ep->path);
    if (strncmp(loc->path, ep->path, n) != 0)
        return 0;
    /* under the endpoint's path, or at it with nothing after (no query) */
    return loc->path[n] == '/' || (loc->path[n] == '\0' && loc->name_len == strlen(loc->given));
}

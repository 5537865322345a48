/* test_trust_plan.c: the trust plan of an open (src/trust/trust_plan.h),
 * the one place that decides what an open trusts: a table of locations
 * (local, remote, Hub, S3) x manifest_path (none, local, remote) x keys
 * (none, Ed25519, EC, both) x CAs and signature_path x verify policy, each
 * with the plan expected or the rejection; then which of the Hub's digests
 * may stand in for a manifest (a snapshot's blob names, an hf:// model's
 * LFS SHA-256; never for a mirror) and the plans the stand-in and a
 * manifest derived from it are read under; then the format chosen for a
 * manifest (model.sig beside the model or not), the messages of a plan
 * that fails closed, and the loader refusing a manifest under such a plan
 * before reading a byte of its signature. */
#include "util.h"

#include "index/index.h"
#include "trust/manifest.h"
#include "trust/trust_plan.h"
#include "trust_fixture.h"
#include "sluice.h"

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct fx {
    char *dir;
    char *ed_pub; /* an Ed25519 public key (PEM) */
    char *ec_pub; /* a P-256 public key (PEM) */
} fx;

static char *write_pub(const char *dir, const char *name, EVP_PKEY *k)
{
    char *path = tu_join(dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PUBKEY(f, k), 1);
    assert_int_equal(fclose(f), 0);
    EVP_PKEY_free(k);
    return path;
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = tu_tmpdir();
    EVP_PKEY *ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    assert_non_null(ed);
    assert_non_null(ec);
    f->ed_pub = write_pub(f->dir, "ed.pub", ed);
    f->ec_pub = write_pub(f->dir, "ec.pub", ec);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rmtree(f->dir);
    free(f->dir);
    free(f->ed_pub);
    free(f->ec_pub);
    free(f);
    return 0;
}

#define LOCAL "/models/m/model.safetensors"
#define HTTPS "https://example.invalid/m/model.safetensors"
#define HUB "hf://org/name"
#define S3 "s3://bucket/m/model.safetensors"
#define MF_LOCAL "/models/m/elsewhere.json"
#define MF_REMOTE "https://example.invalid/m/model.safetensors.manifest.json"

enum { K_NONE, K_ED, K_EC, K_BOTH };
#define ED SL_SIG_ED25519
#define OSSF SL_SIG_OPENSSF
#define V_DEF SLUICE_VERIFY_DEFAULT
#define V_IFP SLUICE_VERIFY_IF_PRESENT
#define V_REQ SLUICE_VERIFY_REQUIRE
#define V_OFF SLUICE_VERIFY_OFF

typedef struct tp_case {
    const char *what;
    const char *model;
    const char *manifest;   /* manifest_path, or NULL */
    int keys;               /* K_* */
    int cas;                /* one CA (the file need not be one: not read) */
    const char *sig_path;   /* signature_path, or NULL */
    sluice_verify_policy verify;
    int rc;                 /* SLUICE_OK or the rejection */
    sl_manifest_from from;
    unsigned formats;
    int bundle_if_present, fail_closed, signature_asked, require;
    const char *why;        /* in the reason (OK) or the message (rejected) */
} tp_case;

static const tp_case cases[] = {
    /* no signature asked: each policy, each manifest source */
    {"local, default", LOCAL, NULL, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR, 0, 0, 0, 0, 0, "no signature asked"},
    {"local, if-present", LOCAL, NULL, K_NONE, 0, NULL, V_IFP, SLUICE_OK, SL_MF_SIDECAR, 0, 0, 0, 0, 0, "no signature asked"},
    {"local, require", LOCAL, NULL, K_NONE, 0, NULL, V_REQ, SLUICE_OK, SL_MF_SIDECAR, 0, 0, 0, 0, 1, "no signature asked"},
    {"local, off", LOCAL, NULL, K_NONE, 0, NULL, V_OFF, SLUICE_OK, SL_MF_NONE, 0, 0, 0, 0, 0, "policy OFF"},
    {"local, off ignores manifest_path", LOCAL, MF_LOCAL, K_NONE, 0, NULL, V_OFF, SLUICE_OK, SL_MF_NONE, 0, 0, 0, 0, 0, "policy OFF"},
    {"local, manifest_path", LOCAL, MF_LOCAL, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, 0, 0, 0, 0, 0, "no signature asked"},
    {"local, remote manifest_path", LOCAL, MF_REMOTE, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH_REMOTE, 0, 0, 0, 0, 0, "no signature asked"},
    {"https, default", HTTPS, NULL, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, 0, 0, 0, 0, 0, "no signature asked"},
    {"https, require", HTTPS, NULL, K_NONE, 0, NULL, V_REQ, SLUICE_OK, SL_MF_SIDECAR_REMOTE, 0, 0, 0, 0, 1, "no signature asked"},
    {"hub, default", HUB, NULL, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, 0, 0, 0, 0, 0, "no signature asked"},
    {"https, local manifest_path", HTTPS, MF_LOCAL, K_NONE, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, 0, 0, 0, 0, 0, "no signature asked"},
    /* Ed25519 keys: M.sig, each policy; a remote manifest's is fetched */
    {"local, ed, default", LOCAL, NULL, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR, ED, 0, 0, 1, 0, "Ed25519"},
    {"local, ed, if-present", LOCAL, NULL, K_ED, 0, NULL, V_IFP, SLUICE_OK, SL_MF_SIDECAR, ED, 0, 0, 1, 0, "Ed25519"},
    {"local, ed, require", LOCAL, NULL, K_ED, 0, NULL, V_REQ, SLUICE_OK, SL_MF_SIDECAR, ED, 0, 0, 1, 1, "Ed25519"},
    {"local, ed, manifest_path", LOCAL, MF_LOCAL, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, ED, 0, 0, 1, 0, "Ed25519"},
    {"local, ed, remote manifest_path", LOCAL, MF_REMOTE, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH_REMOTE, ED, 0, 0, 1, 0, "fetched beside the remote manifest"},
    {"https, ed", HTTPS, NULL, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, ED, 0, 0, 1, 0, "fetched beside the remote manifest"},
    {"https, ed, require", HTTPS, NULL, K_ED, 0, NULL, V_REQ, SLUICE_OK, SL_MF_SIDECAR_REMOTE, ED, 0, 0, 1, 1, "fetched beside the remote manifest"},
    {"hub, ed (bd684d5)", HUB, NULL, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, ED, 0, 0, 1, 0, "fetched beside the remote manifest"},
    {"s3, ed", S3, NULL, K_ED, 0, NULL, V_IFP, SLUICE_OK, SL_MF_SIDECAR_REMOTE, ED, 0, 0, 1, 0, "fetched beside the remote manifest"},
    {"https, ed, local manifest_path", HTTPS, MF_LOCAL, K_ED, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, ED, 0, 0, 1, 0, "Ed25519"},
    /* EC keys: a bundle beside a local model, else M.sig */
    {"local, ec", LOCAL, NULL, K_EC, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR, ED | OSSF, 1, 0, 1, 0, "model.sig"},
    {"local, ed+ec", LOCAL, NULL, K_BOTH, 0, NULL, V_REQ, SLUICE_OK, SL_MF_SIDECAR, ED | OSSF, 1, 0, 1, 1, "model.sig"},
    {"https, ec, local manifest_path", HTTPS, MF_LOCAL, K_EC, 0, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, ED, 0, 0, 1, 0, "Ed25519"},
    {"https, ec", HTTPS, NULL, K_EC, 0, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, ED | OSSF, 1, 0, 1, 0, "model.sig"},
    /* CAs or signature_path: the OpenSSF bundle only; a remote model's is fetched */
    {"local, ca", LOCAL, NULL, K_NONE, 1, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR, OSSF, 0, 0, 1, 0, "OpenSSF"},
    {"local, ed, signature_path", LOCAL, NULL, K_ED, 0, "/models/m/b.sig", V_DEF, SLUICE_OK, SL_MF_SIDECAR, OSSF, 0, 0, 1, 0, "OpenSSF"},
    {"local, ca, require", LOCAL, MF_LOCAL, K_NONE, 1, NULL, V_REQ, SLUICE_OK, SL_MF_PATH, OSSF, 0, 0, 1, 1, "OpenSSF"},
    {"https, ca", HTTPS, NULL, K_NONE, 1, NULL, V_DEF, SLUICE_OK, SL_MF_SIDECAR_REMOTE, OSSF, 0, 0, 1, 0, "fetched beside the remote model"},
    {"hub, ca", HUB, NULL, K_NONE, 1, NULL, V_IFP, SLUICE_OK, SL_MF_SIDECAR_REMOTE, OSSF, 0, 0, 1, 0, "fetched beside the remote model"},
    {"https, ca, local manifest_path", HTTPS, MF_LOCAL, K_NONE, 1, NULL, V_DEF, SLUICE_OK, SL_MF_PATH, OSSF, 0, 0, 1, 0, "fetched beside the remote model"},
    {"local, ca, remote manifest_path", LOCAL, MF_REMOTE, K_NONE, 1, NULL, V_DEF, SLUICE_OK, SL_MF_PATH_REMOTE, OSSF, 0, 0, 1, 0, "fetched beside the remote model"},
    /* rejections: a signature asked of an open that reads no manifest */
    {"ed with off", LOCAL, NULL, K_ED, 0, NULL, V_OFF, SLUICE_E_INVAL, 0, 0, 0, 0, 0, 0, "trusted_keys ask for a signed manifest, but the verify policy is SLUICE_VERIFY_OFF"},
    {"ec with off, remote", HTTPS, NULL, K_EC, 0, NULL, V_OFF, SLUICE_E_INVAL, 0, 0, 0, 0, 0, 0, "SLUICE_VERIFY_OFF"},
    {"ca with off", LOCAL, NULL, K_NONE, 1, NULL, V_OFF, SLUICE_E_INVAL, 0, 0, 0, 0, 0, 0, "trusted_cas or signature_path ask for a signed model"},
    {"signature_path alone", LOCAL, NULL, K_NONE, 0, "/models/m/b.sig", V_DEF, SLUICE_E_INVAL, 0, 0, 0, 0, 0, 0, "signature_path is set, but neither"},
    {"signature_path alone, off", LOCAL, NULL, K_NONE, 0, "/models/m/b.sig", V_OFF, SLUICE_E_INVAL, 0, 0, 0, 0, 0, 0, "signature_path is set, but neither"},
};

/* *o, the options of a row: its keys (K_*, listed in list), a CA or not,
 * its manifest_path, signature_path and policy. */
static void row_options(const fx *f, int keys, int cas, const char *manifest, const char *sig_path,
                        sluice_verify_policy verify, const char *list[2], sluice_options *o)
{
    static const char *ca[] = {"/models/ca.pem"};
    sluice_options_init(o);
    size_t n = 0;
    if (keys == K_ED || keys == K_BOTH)
        list[n++] = f->ed_pub;
    if (keys == K_EC || keys == K_BOTH)
        list[n++] = f->ec_pub;
    o->trusted_keys = n ? list : NULL;
    o->ntrusted_keys = n;
    o->manifest_path = manifest;
    o->trusted_cas = cas ? ca : NULL;
    o->ntrusted_cas = cas ? 1 : 0;
    o->signature_path = sig_path;
    o->verify = verify;
}

static void table(void **state)
{
    fx *f = *state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tp_case *c = &cases[i];
        sluice_options o;
        const char *keys[2];
        row_options(f, c->keys, c->cas, c->manifest, c->sig_path, c->verify, keys, &o);
        sl_trust_plan p;
        sl_err err = {0};
        int rc = tf_plan(&o, c->model, &p, &err);
        if (rc != c->rc)
            fail_msg("%s: rc %d, expected %d (%s)", c->what, rc, c->rc, err.msg);
        if (rc < 0) {
            if (!strstr(err.msg, c->why))
                fail_msg("%s: message \"%s\" lacks \"%s\"", c->what, err.msg, c->why);
            continue;
        }
        if (p.from != c->from || p.formats != c->formats ||
            p.bundle_if_present != c->bundle_if_present || p.fail_closed != c->fail_closed ||
            p.signature_asked != c->signature_asked || p.require != c->require)
            fail_msg("%s: plan from %d formats %u bundle_if_present %d fail_closed %d asked %d "
                     "require %d; expected %d %u %d %d %d %d", c->what, (int)p.from, p.formats,
                     p.bundle_if_present, p.fail_closed, p.signature_asked, p.require,
                     (int)c->from, c->formats, c->bundle_if_present, c->fail_closed,
                     c->signature_asked, c->require);
        if (!p.why || !strstr(p.why, c->why))
            fail_msg("%s: reason \"%s\" lacks \"%s\"", c->what, p.why ? p.why : "(null)", c->why);
        /* the plan borrows the options' lists, never copies them */
        assert_ptr_equal(p.keys, o.trusted_keys);
        assert_int_equal(p.nkeys, o.ntrusted_keys);
        assert_ptr_equal(p.cas, o.trusted_cas);
        assert_ptr_equal(p.bundle_path, o.signature_path);
        assert_ptr_equal(p.manifest_path, o.manifest_path);
        assert_int_equal(p.verify, o.verify);
    }
}

/* Which of the Hub's digests may stand in for a manifest nobody
 * published, decided by the plan: a local model's snapshot blob names
 * (no manifest_path, no signature asked), an hf:// model's LFS SHA-256
 * (no manifest_path; with a signature asked, read failing closed), never
 * for a mirror. Then the plan each is read under (sl_trust_plan_read). */
typedef struct hub_case {
    const char *what;
    const char *model;
    const char *manifest;   /* manifest_path, or NULL */
    int keys, cas;
    sluice_verify_policy verify;
    int mirror;             /* planned as a mirror (sl_trust_plan_mirror) */
    sl_hub_stand_in hub;
} hub_case;

static const hub_case hub_cases[] = {
    {"local, default", LOCAL, NULL, K_NONE, 0, V_DEF, 0, SL_HUB_SNAPSHOT},
    {"local, if-present", LOCAL, NULL, K_NONE, 0, V_IFP, 0, SL_HUB_SNAPSHOT},
    {"local, require", LOCAL, NULL, K_NONE, 0, V_REQ, 0, SL_HUB_SNAPSHOT},
    {"local, off", LOCAL, NULL, K_NONE, 0, V_OFF, 0, SL_HUB_NONE},
    {"local, manifest_path", LOCAL, MF_LOCAL, K_NONE, 0, V_DEF, 0, SL_HUB_NONE},
    {"local, remote manifest_path", LOCAL, MF_REMOTE, K_NONE, 0, V_DEF, 0, SL_HUB_NONE},
    {"local, ed (a snapshot is unsigned)", LOCAL, NULL, K_ED, 0, V_DEF, 0, SL_HUB_NONE},
    {"local, ec", LOCAL, NULL, K_EC, 0, V_DEF, 0, SL_HUB_NONE},
    {"local, ca", LOCAL, NULL, K_NONE, 1, V_DEF, 0, SL_HUB_NONE},
    {"local mirror", LOCAL, NULL, K_NONE, 0, V_DEF, 1, SL_HUB_NONE},
    {"hub, default", HUB, NULL, K_NONE, 0, V_DEF, 0, SL_HUB_LFS},
    {"hub, if-present", HUB, NULL, K_NONE, 0, V_IFP, 0, SL_HUB_LFS},
    {"hub, require", HUB, NULL, K_NONE, 0, V_REQ, 0, SL_HUB_LFS},
    {"hub, off", HUB, NULL, K_NONE, 0, V_OFF, 0, SL_HUB_NONE},
    {"hub, ed (read failing closed)", HUB, NULL, K_ED, 0, V_DEF, 0, SL_HUB_LFS},
    {"hub, ca (read failing closed)", HUB, NULL, K_NONE, 1, V_IFP, 0, SL_HUB_LFS},
    {"hub, remote manifest_path", HUB, MF_REMOTE, K_NONE, 0, V_DEF, 0, SL_HUB_NONE},
    {"hub, local manifest_path", HUB, MF_LOCAL, K_NONE, 0, V_DEF, 0, SL_HUB_NONE},
    {"hub mirror (read as given, never pinned)", HUB, NULL, K_NONE, 0, V_DEF, 1, SL_HUB_NONE},
    {"https, default", HTTPS, NULL, K_NONE, 0, V_DEF, 0, SL_HUB_NONE},
    {"s3, require", S3, NULL, K_NONE, 0, V_REQ, 0, SL_HUB_NONE},
};

static void hub_stand_ins(void **state)
{
    fx *f = *state;
    for (size_t i = 0; i < sizeof hub_cases / sizeof hub_cases[0]; i++) {
        const hub_case *c = &hub_cases[i];
        sluice_options o;
        const char *keys[2];
        row_options(f, c->keys, c->cas, c->manifest, NULL, c->verify, keys, &o);
        sl_trust_plan p;
        sl_err err = {0};
        if (c->mirror) {
            sl_location *l = sl_location_new(c->model);
            sl_location *mf = c->manifest ? sl_location_new(c->manifest) : NULL;
            assert_non_null(l);
            sl_trust_locs at = {l, mf, NULL};
            int needs = 0;
            assert_int_equal(sl_trust_plan_mirror(&o, &at, &p, &needs, &err), SLUICE_OK);
            assert_int_equal(needs, 1);
            sl_location_free(l);
            sl_location_free(mf);
        } else {
            assert_int_equal(tf_plan(&o, c->model, &p, &err), SLUICE_OK);
        }
        if (p.hub_digest != c->hub)
            fail_msg("%s: hub_digest %d, expected %d", c->what, (int)p.hub_digest, (int)c->hub);
        if (p.from == SL_MF_NONE)
            continue;
        /* the Hub's LFS SHA-256: whole files, read under IF_PRESENT, and
         * failing closed exactly when a signature is asked */
        sl_trust_plan r;
        sl_trust_plan_read(&p, SL_READ_HUB_LFS, &r);
        assert_int_equal(r.verify, SLUICE_VERIFY_IF_PRESENT);
        assert_int_equal(r.from, p.from);
        assert_int_equal(r.formats, p.formats);
        if (r.fail_closed != (p.formats != 0))
            fail_msg("%s: the stand-in's plan fail_closed %d, formats %u", c->what,
                     r.fail_closed, p.formats);
        if (r.fail_closed && !strstr(r.why, "publishes no manifest"))
            fail_msg("%s: reason \"%s\"", c->what, r.why);
        /* a manifest derived from the Hub's digests (the cache's record):
         * IF_PRESENT, no signature checked, where the plan asks none; a
         * plan that asks one (keys, CAs) keeps it and fails closed, so no
         * caller can read the record without the signature asked */
        sl_trust_plan_read(&p, SL_READ_DERIVED, &r);
        assert_int_equal(r.verify, SLUICE_VERIFY_IF_PRESENT);
        if (!p.formats) {
            assert_int_equal(r.formats, 0);
            assert_int_equal(r.bundle_if_present, 0);
            assert_int_equal(r.fail_closed, 0);
        } else if (r.formats != p.formats || r.bundle_if_present != p.bundle_if_present ||
                   !r.fail_closed || !strstr(r.why, "derived from the Hub's digests")) {
            fail_msg("%s: the derived record's plan formats %u (asked %u), fail_closed %d, "
                     "reason \"%s\"", c->what, r.formats, p.formats, r.fail_closed, r.why);
        }
        assert_int_equal(r.hub_digest, p.hub_digest);
        assert_ptr_equal(r.keys, p.keys);
        /* neither changes the open's plan */
        assert_int_equal(p.verify, o.verify);
    }
}

/* An index of one local file in f->dir: what sl_trust_plan_format and
 * the loader see of a model. */
typedef struct one_file {
    sl_file file;
    sl_index ix;
    char *path;
} one_file;

static void one_file_init(one_file *of, const char *dir)
{
    memset(of, 0, sizeof *of);
    of->path = tu_join(dir, "model.safetensors");
    of->file.path = of->path;
    of->file.name = "model.safetensors";
    of->file.fd = -1;
    of->ix.files = &of->file;
    of->ix.nfiles = 1;
}

/* The format checked, with and without model.sig beside the model. */
static void format_by_bundle(void **state)
{
    fx *f = *state;
    one_file of;
    one_file_init(&of, f->dir);
    char *mf = tu_join(f->dir, "model.safetensors.manifest.json");
    char *bundle = tu_join(f->dir, "model.sig");
    struct {
        int keys, cas;
        unsigned without, with; /* the format without model.sig, with it */
    } rows[] = {
        {K_NONE, 0, 0, 0},
        {K_ED, 0, ED, ED},       /* Ed25519 keys alone: M.sig, whatever lies beside */
        {K_EC, 0, ED, OSSF},     /* EC keys: the bundle when there */
        {K_BOTH, 0, ED, OSSF},
        {K_NONE, 1, OSSF, OSSF}, /* CAs: the bundle, there or not (its absence is its check's) */
        {K_ED, 1, OSSF, OSSF},
    };
    for (int with = 0; with < 2; with++) {
        if (with)
            tu_write_file(bundle, "{}", 2);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            sluice_options o;
            const char *keys[2];
            row_options(f, rows[i].keys, rows[i].cas, NULL, NULL, SLUICE_VERIFY_DEFAULT, keys,
                        &o);
            sl_trust_plan p;
            sl_err err = {0};
            assert_int_equal(tf_plan(&o, of.path, &p, &err), SLUICE_OK);
            unsigned got = sl_trust_plan_format(&p, &of.ix, mf);
            if (got != (with ? rows[i].with : rows[i].without))
                fail_msg("row %zu, model.sig %s: format %u, expected %u", i,
                         with ? "present" : "absent", got, with ? rows[i].with : rows[i].without);
        }
    }
    free(bundle);
    free(mf);
    free(of.path);
}

/* A plan that fails closed (the Hub's digests standing in for a
 * manifest, which nobody signed) says why, naming the manifest (for
 * M.sig, the signature file), never a local command to run. */
static void refusals(void **state)
{
    fx *f = *state;
    const char *keys[1] = {f->ed_pub};
    static const char *ca[] = {"/models/ca.pem"};
    sluice_options o;
    sluice_options_init(&o);
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    sl_trust_plan p;
    sl_err err = {0};
    assert_int_equal(tf_plan(&o, HUB, &p, &err), SLUICE_OK);
    sl_trust_plan_hub_stand_in(&p);
    assert_int_equal(p.fail_closed, 1);
    const char *hub_named = "hf://org/name@0123 (the Hub's LFS SHA-256)";
    assert_int_equal(sl_trust_plan_refuse(&p, hub_named, &err), SLUICE_E_SIGNATURE);
    assert_non_null(strstr(err.msg, "signature of hf://org/name@0123 (the Hub's LFS SHA-256).sig: "
                                    "missing: the repository publishes no manifest"));
    assert_null(strstr(err.msg, "sluice sign"));
    o.trusted_keys = NULL;
    o.ntrusted_keys = 0;
    o.trusted_cas = ca;
    o.ntrusted_cas = 1;
    assert_int_equal(tf_plan(&o, HTTPS, &p, &err), SLUICE_OK);
    assert_int_equal(p.fail_closed, 0);     /* model.sig is fetched */
    sl_trust_plan_hub_stand_in(&p);
    assert_int_equal(sl_trust_plan_refuse(&p, MF_REMOTE, &err), SLUICE_E_SIGNATURE);
    assert_non_null(strstr(err.msg, "signature of " MF_REMOTE ": the repository publishes no "
                                    "manifest"));
    /* no signature asked: nothing to fail closed */
    o.trusted_cas = NULL;
    o.ntrusted_cas = 0;
    assert_int_equal(tf_plan(&o, HUB, &p, &err), SLUICE_OK);
    sl_trust_plan_hub_stand_in(&p);
    assert_int_equal(p.fail_closed, 0);
    o.trusted_cas = ca;
    o.ntrusted_cas = 1;
    assert_int_equal(sl_trust_plan_no_manifest(&p, LOCAL, "A nor B", &err), SLUICE_E_SIGNATURE);
    assert_non_null(strstr(err.msg, LOCAL ": trusted keys are set but there is no manifest"));
    assert_non_null(strstr(err.msg, "no sidecar A nor B"));
}

/* The loader asks the plan: under trusted CAs a manifest is checked by
 * the model's OpenSSF bundle, which must be there (none: fails closed). */
static void loader_fails_closed(void **state)
{
    fx *f = *state;
    one_file of;
    one_file_init(&of, f->dir);
    char *mf = tu_join(f->dir, "local.manifest.json");
    tu_write_file(mf, "{}", 2);
    static const char *ca[] = {"/models/ca.pem"};
    sluice_options o;
    sluice_options_init(&o);
    o.trusted_cas = ca;
    o.ntrusted_cas = 1;
    o.manifest_path = mf;
    sl_trust_plan p;
    sl_err err = {0};
    assert_int_equal(tf_plan(&o, HTTPS, &p, &err), SLUICE_OK);
    sl_manifest *m = (sl_manifest *)&of; /* must be reset */
    int hub_only = 7;
    assert_int_equal(tf_load(&of.ix, &p, HTTPS, &m, &hub_only, &err),
                     SLUICE_E_SIGNATURE);
    assert_null(m);
    assert_int_equal(hub_only, 0);
    assert_non_null(strstr(err.msg, "model.sig"));
    /* a manifest derived from the Hub's digests, read under a plan that
     * asks a signature (a local snapshot's record with trusted keys, as
     * a caller could ask of sl_trust_plan_read): refused by the loader
     * (before, the plan dropped the keys and the record was parsed) */
    const char *keys[1] = {f->ed_pub};
    sluice_options_init(&o);
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    assert_int_equal(tf_plan(&o, LOCAL, &p, &err), SLUICE_OK);
    sl_trust_plan r;
    sl_trust_plan_read(&p, SL_READ_DERIVED, &r);
    char *named = tu_join(f->dir, "derived.manifest.json"), *text = strdup("{}");
    assert_non_null(text);
    m = (sl_manifest *)&of;
    int rc = sl_manifest_from_text(&of.ix, &r, named, text, 2, &m, &err);
    if (rc != SLUICE_E_SIGNATURE || !strstr(err.msg, "derived from the Hub's digests"))
        fail_msg("a derived record under trusted keys: %d \"%s\"", rc, err.msg);
    assert_null(m);
    o.trusted_keys = NULL;
    o.ntrusted_keys = 0;
    /* policy OFF reads nothing, not even manifest_path */
    o.trusted_cas = NULL;
    o.ntrusted_cas = 0;
    o.verify = SLUICE_VERIFY_OFF;
    assert_int_equal(tf_plan(&o, LOCAL, &p, &err), SLUICE_OK);
    m = (sl_manifest *)&of;
    assert_int_equal(tf_load(&of.ix, &p, LOCAL, &m, NULL, &err), SLUICE_OK);
    assert_null(m);
    free(mf);
    free(of.path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(table, setup, teardown),
        cmocka_unit_test_setup_teardown(hub_stand_ins, setup, teardown),
        cmocka_unit_test_setup_teardown(format_by_bundle, setup, teardown),
        cmocka_unit_test_setup_teardown(refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(loader_fails_closed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

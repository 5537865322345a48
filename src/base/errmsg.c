/* errmsg.c: per-thread error detail, keyed by model id (see errmsg.h). */
#include "base/errmsg.h"

#include "base/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct sl_errmsg_entry {
    struct sl_errmsg_entry *next; /* next less recently failed model */
    uint64_t id;
    char msg[SL_ERRMSG_MAX];
} sl_errmsg_entry;

/* The one key of the process, made once. Process-wide state is the point
 * here: a key per model ran out at PTHREAD_KEYS_MAX (1024) open models. */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static int key_ok;

/* Model ids; 0 is never handed out. 64 bits do not wrap in practice. */
static atomic_uint_least64_t next_id = 1;

/* Only for the test hook: entries allocated and not yet freed. */
static atomic_size_t live;

/* Runs in each exiting thread that recorded a failure: frees its list. */
static void free_list(void *head)
{
    for (sl_errmsg_entry *e = head, *next; e; e = next) {
        next = e->next;
        free(e);
        atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    }
}

static void make_key(void)
{
    key_ok = pthread_key_create(&key, free_list) == 0;
}

static int have_key(void)
{
    return pthread_once(&key_once, make_key) == 0 && key_ok;
}

uint64_t sl_errmsg_new_id(void)
{
    return atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
}

void sl_errmsg_set(uint64_t id, const char *msg)
{
    if (!have_key())
        return;
    sl_errmsg_entry *head = pthread_getspecific(key), *e = head, *prev = NULL, *before_last = NULL;
    size_t n = 0;
    for (; e && e->id != id; prev = e, e = e->next) {
        before_last = prev;
        n++;
    }
    if (e) {
        if (prev) { /* move to the front: the most recently failed model */
            prev->next = e->next;
            e->next = head;
        }
    } else if (n < SLUICE_ERRMSG_MODELS) {
        if (!(e = malloc(sizeof *e)))
            return;
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
        e->next = head;
    } else {
        /* The list is full: reuse the least recently failed model's entry
         * (prev is the last one), so that a thread failing on ever new
         * models never grows. */
        e = prev;
        if (before_last) {
            before_last->next = NULL;
            e->next = head;
        }
    }
    e->id = id;
    size_t len = strnlen(msg, sizeof e->msg - 1);
    memcpy(e->msg, msg, len);
    e->msg[len] = '\0';
    if (e != head && pthread_setspecific(key, e) != 0) {
        /* glibc may fail (ENOMEM) the first store of a thread for a key
         * past its first 32; e, linked in front of head, is then out of
         * reach: free it rather than leak (the detail is lost). */
        if (e->next == head) {
            free(e);
            atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
        }
    }
}

const char *sl_errmsg_get(uint64_t id)
{
    if (!have_key())
        return "";
    for (const sl_errmsg_entry *e = pthread_getspecific(key); e; e = e->next)
        if (e->id == id)
            return e->msg;
    return "";
}

void sl_errmsg_forget(uint64_t id)
{
    if (!have_key())
        return;
    sl_errmsg_entry *head = pthread_getspecific(key), *prev = NULL;
    for (sl_errmsg_entry *e = head; e; prev = e, e = e->next)
        if (e->id == id) {
            if (prev)
                prev->next = e->next;
            else
                pthread_setspecific(key, e->next);
            free(e);
            atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
            return;
        }
}

size_t sl_errmsg_live_entries(void)
{
    return atomic_load_explicit(&live, memory_order_relaxed);
}

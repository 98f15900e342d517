// SPDX-License-Identifier: BSD-2-Clause
/*
 * The kernel's big tables (kallsyms, the vmlinux BTF), parsed into the flat columns the Python side keeps
 * (symbols/kernel_tables.py loads this with ctypes). A cold start parses ~150k kallsyms lines and ~150k
 * BTF types; in Python that took 5-6 s under emulation, here it takes tens of milliseconds. Pure functions
 * of their input bytes: nothing here reads a file or the kernel, so unit tests drive them with fixtures.
 *
 * Every function returns a table allocated here, freed with kt_free(); on bad input the table has
 * count 0 and `error` set to one sentence. Names are kept in the layout of symbols/names.py: one blob
 * "\nname0\nname1\n...\n" and the byte offset where each begins (plus the end), in the table's row order.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KT_ABI 4 /* symbols/kernel_tables.py refuses a library of another layout */

struct kt_table {
	uint64_t count;      /* rows */
	uint64_t *values;    /* per row: the address (kallsyms), or BTF id << 4 | return kind code (BTF) */
	char *blob;          /* the rows' names: "\nname0\nname1\n...\n" */
	uint64_t blob_len;
	uint32_t *starts;    /* count + 1: where each name begins in `blob`, then blob_len */
	uint32_t *order;     /* kallsyms: row positions sorted by (name, position) */
	uint32_t *dups;      /* kallsyms: indexes k of `order` whose name equals that of order[k - 1] */
	uint64_t ndups;
	uint32_t *run_starts; /* kallsyms: rows where the module changes */
	char *run_mods;      /* the module from there on, one per line ("" for vmlinux): "mod0\nmod1\n" */
	uint64_t nruns;
	uint64_t run_mods_len;
	char error[200];
};

int kt_abi(void) { return KT_ABI; }

/* the table's columns freed and emptied; its error stays */
static void drop_columns(struct kt_table *t)
{
	char error[sizeof(t->error)];

	free(t->values);
	free(t->blob);
	free(t->starts);
	free(t->order);
	free(t->dups);
	free(t->run_starts);
	free(t->run_mods);
	memcpy(error, t->error, sizeof(error));
	memset(t, 0, sizeof(*t));
	memcpy(t->error, error, sizeof(error));
}

void kt_free(struct kt_table *t)
{
	if (!t)
		return;
	drop_columns(t);
	free(t);
}

/*
 * Adds deltas[r] (modulo 2^64: a move down is a large delta) to every address of run r, the rows from
 * run_starts[r] to the next run's start, in place: the kallsyms columns of an earlier boot moved to this
 * boot's KASLR offset and module addresses (symbols/kallsyms.py Kallsyms.moved). ~150k rows: a loop that
 * takes Python a tenth of a second under emulation.
 */
void kt_shift(uint64_t *addrs, uint64_t n, const uint64_t *run_starts, const uint64_t *deltas, uint64_t nruns)
{
	for (uint64_t r = 0; r < nruns; r++) {
		uint64_t end = r + 1 < nruns ? run_starts[r + 1] : n;

		for (uint64_t i = run_starts[r]; i < end && i < n; i++)
			addrs[i] += deltas[r];
	}
}

static struct kt_table *fail(struct kt_table *t, const char *msg)
{
	drop_columns(t);
	if (!t->error[0])
		snprintf(t->error, sizeof(t->error), "%s", msg);
	return t;
}

/* ---- kallsyms ---- */

struct sym {
	uint64_t addr;
	const char *name;
	const char *mod; /* "" for vmlinux */
	uint32_t name_len, mod_len;
};

static int cmp_str(const char *a, uint32_t alen, const char *b, uint32_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);
	return c ? c : (alen > blen) - (alen < blen);
}

/* equal strings: no call for the common answers (lengths differ, both empty) */
static int same_str(const char *a, uint32_t alen, const char *b, uint32_t blen)
{
	return alen == blen && (!alen || (a[0] == b[0] && !memcmp(a, b, alen)));
}

static int cmp_sym(const void *pa, const void *pb)
{
	const struct sym *a = pa, *b = pb;
	int c;

	if (a->addr != b->addr)
		return a->addr < b->addr ? -1 : 1;
	c = cmp_str(a->name, a->name_len, b->name, b->name_len);
	return c ? c : cmp_str(a->mod, a->mod_len, b->mod, b->mod_len);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/*
 * One line "addr type name" or "addr type name\t[module]" (text up to `end`, no newline), kept when the
 * type is a code symbol (t, T, w, W) and the module is no pseudo-module of what comes and goes with an
 * attach: [bpf] always, [__builtin__*] (ftrace and kprobe trampolines) when `stable`.
 */
static int parse_line(const char *p, const char *end, int stable, struct sym *out)
{
	const char *name, *q;
	uint64_t addr = 0;
	int digits = 0;

	for (; p < end && ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')); p++, digits++)
		addr = addr << 4 | (uint64_t)(*p <= '9' ? *p - '0' : *p - 'a' + 10);
	if (!digits || digits > 16 || end - p < 4 || p[0] != ' ' || p[2] != ' ')
		return 0;
	if (p[1] != 't' && p[1] != 'T' && p[1] != 'w' && p[1] != 'W')
		return 0;
	name = p += 3;
	while (p < end && !is_space(*p))
		p++;
	if (p == name)
		return 0;
	out->addr = addr, out->name = name, out->name_len = (uint32_t)(p - name);
	out->mod = "", out->mod_len = 0;
	if (p == end)
		return 1;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	/* "[module]": no blank inside, at least one character, the line's last one "]" */
	if (p == end || *p != '[' || end - p < 3 || end[-1] != ']')
		return 0;
	for (q = p + 1; q < end; q++)
		if (is_space(*q))
			return 0;
	out->mod = p + 1, out->mod_len = (uint32_t)(end - 1 - (p + 1));
	if (out->mod_len == 3 && !memcmp(out->mod, "bpf", 3))
		return 0;
	if (stable && out->mod_len >= 11 && !memcmp(out->mod, "__builtin__", 11))
		return 0;
	return 1;
}

/*
 * The kernel lists symbols by address (modules after vmlinux), all but a few names at one address: an
 * insertion sort is linear on that; input far from sorted goes to qsort after a bounded number of moves.
 */
static void sort_rows(struct sym *rows, uint64_t n)
{
	uint64_t i, moves = 0;

	for (i = 1; i < n; i++) {
		struct sym x = rows[i];
		uint64_t j = i;

		while (j > 0 && cmp_sym(&rows[j - 1], &x) > 0) {
			rows[j] = rows[j - 1];
			j--;
			if (++moves > 8 * n) {
				rows[j] = x;
				qsort(rows, n, sizeof(*rows), cmp_sym);
				return;
			}
		}
		rows[j] = x;
	}
}

/* A name's first 8 bytes as one big-endian number: most comparisons of the sort by name end there. */
struct keyed {
	uint64_t prefix;
	const char *name;
	uint32_t len, pos;
};

/* the 8 bytes of a name from `at`, zeros past its end */
static uint64_t prefix_at(const char *name, uint32_t len, uint32_t at)
{
	uint64_t p = 0;
	uint32_t i;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	if (len >= at + 8) { /* most names: one load */
		memcpy(&p, name + at, 8);
		return __builtin_bswap64(p);
	}
#endif
	for (i = at; i < at + 8; i++)
		p = p << 8 | (i < len ? (uint8_t)name[i] : 0);
	return p;
}

static uint64_t prefix_of(const char *name, uint32_t len) { return prefix_at(name, len, 0); }

static int cmp_keyed(const void *pa, const void *pb)
{
	const struct keyed *a = pa, *b = pb;
	int c;

	if (a->prefix != b->prefix)
		return a->prefix < b->prefix ? -1 : 1;
	c = cmp_str(a->name, a->len, b->name, b->len); /* names hold no NUL: equal prefixes, equal 8 bytes */
	return c ? c : (a->pos > b->pos) - (a->pos < b->pos);
}

/* k[0..n) by prefix, a stable LSD radix sort; its own frame, so that the 16 KiB of counts are not on the stack
 * of every level of sort_keyed_from (names of 512 bytes sharing their heads go 64 levels deep) */
static __attribute__((noinline)) void radix_by_prefix(struct keyed *k, struct keyed *tmp, uint64_t n)
{
	uint64_t count[8][256], i;
	struct keyed *from = k, *to = tmp, *swap;
	unsigned d;

	memset(count, 0, sizeof(count));
	for (i = 0; i < n; i++) {
		uint64_t x = k[i].prefix;

		count[0][x & 0xff]++, count[1][x >> 8 & 0xff]++, count[2][x >> 16 & 0xff]++;
		count[3][x >> 24 & 0xff]++, count[4][x >> 32 & 0xff]++, count[5][x >> 40 & 0xff]++;
		count[6][x >> 48 & 0xff]++, count[7][x >> 56]++;
	}
	for (d = 0; d < 8; d++) { /* least significant byte first */
		uint64_t at = 0, c;

		if (count[d][k[0].prefix >> (8 * d) & 0xff] == n)
			continue; /* one value of this byte: nothing moves */
		for (c = 0; c < 256; c++) {
			uint64_t m = count[d][c];

			count[d][c] = at, at += m;
		}
		for (i = 0; i < n; i++)
			to[count[d][from[i].prefix >> (8 * d) & 0xff]++] = from[i];
		swap = from, from = to, to = swap;
	}
	if (from != k)
		memcpy(k, from, n * sizeof(*k));
}

/*
 * k[0..n) (prefixes of the 8 bytes from `depth`, every name equal before it) sorted by (name, position)
 * as qsort with cmp_keyed would: by the prefix, then each run of one prefix by the next 8 bytes. qsort's
 * 2M indirect comparisons of 150k names were a third of a kallsyms parse. Stable passes keep the input's
 * position order among equal names; `tmp` holds n entries.
 */
static void sort_keyed_from(struct keyed *k, struct keyed *tmp, uint64_t n, uint32_t depth)
{
	uint64_t i, j, m;

	if (n < 32) { /* insertion sort: stable, and cmp_keyed's name comparison settles the rest */
		for (i = 1; i < n; i++) {
			struct keyed x = k[i];

			for (j = i; j > 0 && cmp_keyed(&k[j - 1], &x) > 0; j--)
				k[j] = k[j - 1];
			k[j] = x;
		}
		return;
	}
	radix_by_prefix(k, tmp, n);
	for (i = 0; i < n; i = j) {
		int longer = 0;

		for (j = i + 1; j < n && k[j].prefix == k[i].prefix; j++)
			;
		for (m = i; m < j && j - i > 1; m++)
			longer |= k[m].len > depth + 8;
		if (!longer)
			continue; /* one name (or one entry): in position order already */
		for (m = i; m < j; m++)
			k[m].prefix = prefix_at(k[m].name, k[m].len, depth + 8);
		sort_keyed_from(k + i, tmp, j - i, depth + 8);
	}
}

/* sorted by (name, position); 0 when out of memory */
static int sort_keyed(struct keyed *k, uint64_t n)
{
	struct keyed *tmp = malloc((n ? n : 1) * sizeof(*k));

	if (!tmp)
		return 0;
	sort_keyed_from(k, tmp, n, 0);
	free(tmp);
	return 1;
}

/* positions 0..n-1 of names[] sorted by (name, position), into order[]; 0 when out of memory */
static int sort_by_name(const struct sym *rows, uint64_t n, uint32_t *order)
{
	struct keyed *k = malloc(n * sizeof(*k));
	uint64_t i;

	if (!k)
		return 0;
	for (i = 0; i < n; i++) {
		k[i].prefix = prefix_of(rows[i].name, rows[i].name_len);
		k[i].name = rows[i].name, k[i].len = rows[i].name_len, k[i].pos = (uint32_t)i;
	}
	if (!sort_keyed(k, n)) {
		free(k);
		return 0;
	}
	for (i = 0; i < n; i++)
		order[i] = k[i].pos;
	free(k);
	return 1;
}

struct kt_table *kt_kallsyms(const char *text, uint64_t len, int stable)
{
	struct kt_table *t = calloc(1, sizeof(*t));
	struct sym *rows = NULL;
	uint64_t n = 0, cap = 0, blob = 1, mods = 0, i, k;
	const char *p = text, *end = text + len;

	if (!t)
		return NULL;
	for (cap = 1; p < end && (p = memchr(p, '\n', (size_t)(end - p))); p++)
		cap++; /* a row per line at most: no growth copies (page faults are dear under emulation) */
	rows = malloc(cap * sizeof(*rows));
	if (!rows)
		return fail(t, "out of memory parsing kallsyms");
	p = text;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *eol = nl ? nl : end;
		struct sym s;

		if (parse_line(p, eol, stable, &s)) {
			if (n == cap) {
				struct sym *more = realloc(rows, (cap = cap ? cap * 2 : 65536) * sizeof(*rows));

				if (!more) {
					free(rows);
					return fail(t, "out of memory parsing kallsyms");
				}
				rows = more;
			}
			rows[n++] = s;
			blob += s.name_len + 1;
		}
		p = eol + 1;
	}
	if (!n) {
		free(rows);
		return fail(t, "no function symbols found in kallsyms");
	}
	if (blob > UINT32_MAX) {
		free(rows);
		return fail(t, "kallsyms names exceed 4 GiB");
	}
	sort_rows(rows, n); /* (address, name, module): symbols/kallsyms.py's order */
	t->values = malloc(n * sizeof(*t->values));
	t->blob = malloc(blob);
	t->starts = malloc((n + 1) * sizeof(*t->starts));
	t->order = malloc(n * sizeof(*t->order));
	t->dups = malloc(n * sizeof(*t->dups));
	t->run_starts = malloc(n * sizeof(*t->run_starts));
	for (i = 0; i < n; i++)
		if (i == 0 || !same_str(rows[i].mod, rows[i].mod_len, rows[i - 1].mod, rows[i - 1].mod_len))
			mods += rows[i].mod_len + 1;
	t->run_mods = malloc(mods + 1);
	if (!t->values || !t->blob || !t->starts || !t->order || !t->dups || !t->run_starts || !t->run_mods) {
		free(rows);
		return fail(t, "out of memory parsing kallsyms");
	}
	t->blob[0] = '\n';
	t->blob_len = 1;
	for (i = 0; i < n; i++) {
		t->values[i] = rows[i].addr;
		t->starts[i] = (uint32_t)t->blob_len;
		memcpy(t->blob + t->blob_len, rows[i].name, rows[i].name_len);
		t->blob_len += rows[i].name_len;
		t->blob[t->blob_len++] = '\n';
		if (i == 0 || !same_str(rows[i].mod, rows[i].mod_len, rows[i - 1].mod, rows[i - 1].mod_len)) {
			t->run_starts[t->nruns++] = (uint32_t)i;
			memcpy(t->run_mods + t->run_mods_len, rows[i].mod, rows[i].mod_len);
			t->run_mods_len += rows[i].mod_len;
			t->run_mods[t->run_mods_len++] = '\n';
		}
	}
	t->starts[n] = (uint32_t)t->blob_len;
	t->count = n;
	if (rows[n - 1].addr == 0) {
		free(rows);
		snprintf(t->error, sizeof(t->error), "zero addresses");
		return fail(t, "");
	}
	if (!sort_by_name(rows, n, t->order)) {
		free(rows);
		return fail(t, "out of memory parsing kallsyms");
	}
	for (k = 1; k < n; k++) {
		const struct sym *a = &rows[t->order[k - 1]], *b = &rows[t->order[k]];

		if (same_str(a->name, a->name_len, b->name, b->name_len))
			t->dups[t->ndups++] = (uint32_t)k;
	}
	free(rows);
	return t;
}

/* ---- available_filter_functions ---- */

static int names_table(struct kt_table *t, struct keyed *k, uint64_t n, uint64_t blob)
{
	uint64_t i;

	t->values = malloc(sizeof(*t->values)); /* unused: the names are the table */
	t->starts = malloc((n + 1) * sizeof(*t->starts));
	t->blob = malloc(blob);
	if (!t->values || !t->starts || !t->blob || blob > UINT32_MAX)
		return 0;
	t->blob[0] = '\n';
	t->blob_len = 1;
	for (i = 0; i < n; i++) {
		t->starts[i] = (uint32_t)t->blob_len;
		memcpy(t->blob + t->blob_len, k[i].name, k[i].len);
		t->blob_len += k[i].len;
		t->blob[t->blob_len++] = '\n';
	}
	t->starts[n] = (uint32_t)t->blob_len;
	t->count = n;
	return 1;
}

/*
 * The first word of every line ("name" or "name [module]", modules not kept), sorted, repeats kept (a
 * static function of one name in several files is listed once per instance); ftrace's placeholders for
 * records of discarded code ("__ftrace_invalid_address__...") left out.
 */
struct kt_table *kt_traceable(const char *text, uint64_t len)
{
	static const char invalid[] = "__ftrace_invalid_address__";
	struct kt_table *t = calloc(1, sizeof(*t));
	struct keyed *k = NULL;
	uint64_t n = 0, cap = 0, blob = 1;
	const char *p = text, *end = text + len;

	if (!t)
		return NULL;
	while (p < end) {
		const char *name;

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		name = p;
		while (p < end && *p != '\n' && !is_space(*p))
			p++;
		if (p > name && !((size_t)(p - name) >= sizeof(invalid) - 1 && !memcmp(name, invalid, sizeof(invalid) - 1))) {
			if (n == cap) {
				struct keyed *more = realloc(k, (cap = cap ? cap * 2 : 65536) * sizeof(*k));

				if (!more) {
					free(k);
					return fail(t, "out of memory parsing available_filter_functions");
				}
				k = more;
			}
			k[n].name = name, k[n].len = (uint32_t)(p - name), k[n].pos = (uint32_t)n;
			k[n].prefix = prefix_of(name, k[n].len);
			blob += k[n++].len + 1;
		}
		while (p < end && *p != '\n')
			p++;
		p++;
	}
	if (!sort_keyed(k, n) || !names_table(t, k, n, blob)) {
		free(k);
		return fail(t, "out of memory parsing available_filter_functions");
	}
	free(k);
	return t;
}

/*
 * The names of a sorted names table (`a`, starts[na + 1]) absent from another (`b`, in the order
 * `b_order`), each once: the traceable functions kallsyms does not name.
 */
struct kt_table *kt_missing(const char *a, const uint32_t *a_starts, uint64_t na, const char *b,
			    const uint32_t *b_starts, const uint32_t *b_order, uint64_t nb)
{
	struct kt_table *t = calloc(1, sizeof(*t));
	struct keyed *k = NULL;
	uint64_t i, j = 0, n = 0, blob = 1;

	if (!t)
		return NULL;
	k = malloc((na + 1) * sizeof(*k));
	if (!k)
		return fail(t, "out of memory");
	for (i = 0; i < na; i++) {
		const char *name = a + a_starts[i];
		uint32_t len = a_starts[i + 1] - a_starts[i] - 1;
		int c = 1;

		if (n && k[n - 1].len == len && !memcmp(k[n - 1].name, name, len))
			continue;
		for (; j < nb; j++) {
			uint32_t at = b_order[j];

			c = cmp_str(b + b_starts[at], b_starts[at + 1] - b_starts[at] - 1, name, len);
			if (c >= 0)
				break;
		}
		if (j == nb || c != 0) {
			k[n].name = name, k[n].len = len;
			blob += len + 1;
			n++;
		}
	}
	if (!names_table(t, k, n, blob)) {
		free(k);
		return fail(t, "out of memory");
	}
	free(k);
	return t;
}

/* ---- lookups of many names at once ---- */

/*
 * For each query name (`q`, qstarts[nq + 1]): where its first instance is in a names table sorted by
 * `order` (NULL: the table itself is sorted) and how many instances it has; values[2i], values[2i + 1]
 * (the first is meaningless when the count is 0). One call for the thousands of functions a large set
 * matches, instead of a dictionary of every name built in Python first.
 */
struct kt_table *kt_find(const char *blob, const uint32_t *starts, const uint32_t *order, uint64_t n,
			 const char *q, const uint32_t *qstarts, uint64_t nq)
{
	struct kt_table *t = calloc(1, sizeof(*t));
	uint64_t i;

	if (!t)
		return NULL;
	t->values = malloc((2 * nq + 1) * sizeof(*t->values));
	if (!t->values)
		return fail(t, "out of memory");
	for (i = 0; i < nq; i++) {
		const char *name = q + qstarts[i];
		uint32_t len = qstarts[i + 1] - qstarts[i] - 1;
		uint64_t lo = 0, hi = n, first;

		while (lo < hi) { /* the first position whose name is not below the query */
			uint64_t mid = lo + (hi - lo) / 2, at = order ? order[mid] : mid;

			if (cmp_str(blob + starts[at], starts[at + 1] - starts[at] - 1, name, len) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		first = lo;
		for (; lo < n; lo++) {
			uint64_t at = order ? order[lo] : lo;

			if (cmp_str(blob + starts[at], starts[at + 1] - starts[at] - 1, name, len))
				break;
		}
		t->values[2 * i] = first;
		t->values[2 * i + 1] = lo - first;
	}
	t->count = nq;
	return t;
}

/* ---- BTF ---- */

#define BTF_MAGIC 0xEB9F
enum { K_INT = 1, K_PTR = 2, K_ARRAY = 3, K_STRUCT = 4, K_UNION = 5, K_ENUM = 6, K_FWD = 7, K_TYPEDEF = 8,
       K_VOLATILE = 9, K_CONST = 10, K_RESTRICT = 11, K_FUNC = 12, K_FUNC_PROTO = 13, K_VAR = 14,
       K_DATASEC = 15, K_FLOAT = 16, K_DECL_TAG = 17, K_TYPE_TAG = 18, K_ENUM64 = 19 };
/* the return kinds, in the order of the `codes` argument (symbols/kernel_tables.py RET_KINDS) */
enum { R_VOID, R_POINTER, R_BOOL, R_UNSIGNED, R_INT32, R_SIGNED, R_UNKNOWN, R_COUNT };

/* 32-bit words after the 12-byte common record: fixed ones and ones per vlen member; -1: unknown kind */
static int extra_words(uint32_t kind, uint32_t vlen, uint64_t *words)
{
	switch (kind) {
	case K_INT: case K_VAR: case K_DECL_TAG: *words = 1; return 0;
	case K_PTR: case K_FWD: case K_TYPEDEF: case K_VOLATILE: case K_CONST: case K_RESTRICT: case K_FUNC:
	case K_FLOAT: case K_TYPE_TAG: *words = 0; return 0;
	case K_ARRAY: *words = 3; return 0;
	case K_STRUCT: case K_UNION: case K_DATASEC: case K_ENUM64: *words = 3ull * vlen; return 0;
	case K_ENUM: case K_FUNC_PROTO: *words = 2ull * vlen; return 0;
	default: return -1;
	}
}

static int classify(const uint32_t *w, const uint64_t *offs, uint64_t ntypes, uint64_t tid)
{
	int hops;

	for (hops = 0; hops < 64; hops++) { /* modifier chains are short; a cycle would be malformed BTF */
		uint32_t info, sot, kind;

		if (tid == 0)
			return R_VOID;
		if (tid > ntypes)
			return R_UNKNOWN;
		info = w[offs[tid] + 1], sot = w[offs[tid] + 2], kind = info >> 24 & 0x1f;
		switch (kind) {
		case K_TYPEDEF: case K_VOLATILE: case K_CONST: case K_RESTRICT: case K_TYPE_TAG:
			tid = sot;
			continue;
		case K_PTR:
			return R_POINTER;
		case K_INT: {
			uint32_t enc = w[offs[tid] + 3] >> 24;

			if (enc & 4)
				return R_BOOL;
			if (!(enc & 1) || sot < 4)
				return R_UNSIGNED;
			return sot == 4 ? R_INT32 : R_SIGNED;
		}
		case K_ENUM: case K_ENUM64:
			return sot == 4 ? R_INT32 : R_SIGNED;
		default:
			return R_UNKNOWN;
		}
	}
	return R_UNKNOWN;
}

struct func {
	const char *name;
	uint32_t name_len, id;
};

static int cmp_func(const void *pa, const void *pb)
{
	const struct func *a = pa, *b = pb;
	int c = cmp_str(a->name, a->name_len, b->name, b->name_len);

	return c ? c : (a->id > b->id) - (a->id < b->id);
}

/*
 * Every named FUNC of a raw little-endian BTF blob (/sys/kernel/btf/vmlinux), sorted by name, the first
 * FUNC of a name only (as libbpf's btf__find_by_name_kind() finds it): values are id << 4 | codes[kind of
 * what it returns]. An unknown kind is refused (error "unknown BTF kind K at type N"): the caller then
 * asks libbpf, which knows it.
 */
struct kt_table *kt_btf_funcs(const uint8_t *data, uint64_t len, const uint8_t *codes)
{
	struct kt_table *t = calloc(1, sizeof(*t));
	uint32_t magic, hdr_len, type_off, type_len, str_off, str_len;
	const uint32_t *w;
	const char *strs;
	uint64_t *offs = NULL, nwords, i, ntypes = 0, nfuncs = 0, blob = 1, k;
	struct func *funcs = NULL;

	if (!t)
		return NULL;
	if (len < 24)
		return fail(t, "BTF blob too short");
	magic = (uint32_t)data[0] | (uint32_t)data[1] << 8;
	memcpy(&hdr_len, data + 4, 4), memcpy(&type_off, data + 8, 4), memcpy(&type_len, data + 12, 4);
	memcpy(&str_off, data + 16, 4), memcpy(&str_len, data + 20, 4);
	if (magic != BTF_MAGIC || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
		return fail(t, "not little-endian BTF");
	if ((uint64_t)hdr_len + type_off + type_len > len || (uint64_t)hdr_len + str_off + str_len > len ||
	    (hdr_len + type_off) % 4)
		return fail(t, "BTF sections out of bounds");
	w = (const uint32_t *)(data + hdr_len + type_off);
	nwords = type_len / 4;
	strs = (const char *)data + hdr_len + str_off;
	offs = malloc((nwords / 3 + 2) * sizeof(*offs)); /* a type takes 3 words at least */
	funcs = malloc((nwords / 3 + 1) * sizeof(*funcs));
	if (!offs || !funcs) {
		free(offs), free(funcs);
		return fail(t, "out of memory indexing BTF");
	}
	offs[0] = 0; /* id 0 is void */
	for (i = 0; i + 3 <= nwords;) {
		uint32_t info = w[i + 1], kind = info >> 24 & 0x1f;
		uint64_t more;

		offs[++ntypes] = i;
		if (extra_words(kind, info & 0xffff, &more)) {
			snprintf(t->error, sizeof(t->error), "unknown BTF kind %u at type %llu", kind,
				 (unsigned long long)ntypes);
			free(offs), free(funcs);
			return fail(t, "");
		}
		if (i + 3 + more > nwords) {
			free(offs), free(funcs);
			return fail(t, "BTF type record runs past the type section");
		}
		if (kind == K_FUNC && w[i] && w[i] < str_len) {
			const char *name = strs + w[i];
			const char *nul = memchr(name, '\0', str_len - w[i]);

			if (nul && nul > name) {
				funcs[nfuncs].name = name, funcs[nfuncs].name_len = (uint32_t)(nul - name);
				funcs[nfuncs++].id = (uint32_t)ntypes;
			}
		}
		i += 3 + more;
	}
	qsort(funcs, nfuncs, sizeof(*funcs), cmp_func);
	for (k = 0; k < nfuncs; k++)
		blob += funcs[k].name_len + 1;
	t->values = malloc((nfuncs + 1) * sizeof(*t->values));
	t->starts = malloc((nfuncs + 1) * sizeof(*t->starts));
	t->blob = malloc(blob);
	if (!t->values || !t->starts || !t->blob || blob > UINT32_MAX) {
		free(offs), free(funcs);
		return fail(t, "out of memory indexing BTF");
	}
	t->blob[0] = '\n';
	t->blob_len = 1;
	for (k = 0; k < nfuncs; k++) {
		const struct func *f = &funcs[k];
		uint32_t proto, ret;
		int kind = R_UNKNOWN;

		if (k && !cmp_str(f->name, f->name_len, funcs[k - 1].name, funcs[k - 1].name_len))
			continue; /* a later FUNC of the same name */
		proto = w[offs[f->id] + 2];
		if (proto > 0 && proto <= ntypes) {
			ret = w[offs[proto] + 2];
			kind = classify(w, offs, ntypes, ret);
		}
		t->values[t->count] = (uint64_t)f->id << 4 | codes[kind];
		t->starts[t->count++] = (uint32_t)t->blob_len;
		memcpy(t->blob + t->blob_len, f->name, f->name_len);
		t->blob_len += f->name_len;
		t->blob[t->blob_len++] = '\n';
	}
	t->starts[t->count] = (uint32_t)t->blob_len;
	free(offs), free(funcs);
	return t;
}

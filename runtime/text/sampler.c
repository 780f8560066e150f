/*
 * sampler.c - per-sequence token sampling (see sampler.h for the order of
 * operations and the semantics of each parameter).
 *
 * Every step is a few O(n_vocab) passes, none a sort, written so the
 * compiler vectorises them (integer compares on float bits, a polynomial
 * exp).  Weights w = exp((logit - max) / T) in [0, 1] replace the logits in
 * place.  Truncation keeps survivors as an ascending id list: top-k and
 * min-p choose candidates from the logits (a heap for small k) and only
 * those get weights; top-p needs the whole row's weight, then looks only at
 * the tokens above a floor no survivor can be under, and finds its boundary
 * by radix selection on the weights' bits.  The draw walks the survivors in
 * id order, so how they were found never changes the token.
 * Per-sequence memory: the distinct tokens seen, plus n_vocab-sized scratch
 * (candidate ids; a raw-logits copy when logprobs are asked for) made on
 * first use.
 * It must never crash or loop on hostile logits (NaN, infinities, all
 * masked): those return KT_ERR_INVALID.
 */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------- */
/* RNG: xoshiro256** seeded through splitmix64                                   */
/* ---------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double xoshiro_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------------------- */
/* the sampler                                                                   */
/* ---------------------------------------------------------------------------- */

/* What the penalties need to know about one token of this sequence. */
struct tally {
    int32_t token;      /* -1: empty slot */
    uint32_t generated; /* times generated (sampled or accepted) */
    bool in_prompt;     /* recorded only when the repetition penalty is on */
};

/* A token in top-k's heap: its logit's ordered_key (see rank_cut) and id. */
struct ranked {
    uint32_t key;
    uint32_t id;
};

/* One bucket per value of the radix digit; 12 bits at most. */
#define RADIX_BUCKETS 4096

struct kt_sampler {
    struct kt_sampler_params params; /* logit_bias points at bias below */
    uint32_t n_vocab;
    bool penalize;                   /* any of the three penalties is on */
    uint64_t rng[4];
    uint64_t n_generated;

    struct tally *tallies;           /* open addressing, capacity a power of two, load <= 1/2 */
    uint32_t tally_capacity;
    uint32_t n_tallies;

    struct kt_logit_bias *bias;      /* params.n_logit_bias entries */
    int32_t *banned;                 /* n_banned distinct ids */
    size_t n_banned, banned_capacity;
    const uint32_t *allowed;         /* (n_vocab bits) the caller's mask; NULL: all */

    float *raw;                      /* (n_vocab) raw logits copy; made on the first logprobs request */
    uint32_t *candidates;            /* (n_vocab) survivor ids; made on the first truncated draw */
    struct ranked *heap;             /* (top_k) the k best so far, when top_k <= HEAP_TOP_K_MAX */

    double bucket_value[RADIX_BUCKETS];   /* radix selection scratch: count or mass */
    uint32_t bucket_count[RADIX_BUCKETS];
};

struct kt_sampler_params kt_sampler_params_default(void)
{
    return (struct kt_sampler_params){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .repetition_penalty = 1.0f,
        .seed = 0,
        .logit_bias = NULL,
        .n_logit_bias = 0,
    };
}

kt_status kt_sampler_params_validate(const struct kt_sampler_params *p, uint32_t n_vocab,
                                     kt_err *err)
{
    if (!p)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: no parameters");
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: vocabulary size %u out of range",
                          n_vocab);
    /* Written as !(in range) so NaN fails every check. */
    if (!(p->temperature >= 0.0f && p->temperature <= FLT_MAX))
        return kt_err_set(err, KT_ERR_INVALID, "sampler: temperature must be >= 0 (got %g)",
                          (double)p->temperature);
    if (p->top_k < -1)
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: top_k must be >= 0, or -1 for off (got %d)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kt_err_set(err, KT_ERR_INVALID, "sampler: top_p must be in (0, 1] (got %g)",
                          (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kt_err_set(err, KT_ERR_INVALID, "sampler: min_p must be in [0, 1] (got %g)",
                          (double)p->min_p);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: presence_penalty must be in [-2, 2] (got %g)",
                          (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: frequency_penalty must be in [-2, 2] (got %g)",
                          (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= FLT_MAX))
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: repetition_penalty must be > 0 (got %g)",
                          (double)p->repetition_penalty);
    if (p->n_logit_bias && !p->logit_bias)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: logit_bias is NULL with %zu entries",
                          p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const struct kt_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || (uint32_t)b->token >= n_vocab)
            return kt_err_set(err, KT_ERR_INVALID,
                              "sampler: logit_bias token %d is outside the vocabulary of %u",
                              b->token, n_vocab);
        if (!isfinite(b->bias))
            return kt_err_set(err, KT_ERR_INVALID,
                              "sampler: logit_bias for token %d is not finite (%g)", b->token,
                              (double)b->bias);
    }
    return KT_OK;
}

static bool token_ok(const struct kt_sampler *s, int32_t token)
{
    return token >= 0 && (uint32_t)token < s->n_vocab;
}

/* ---- tallies: token -> (generated count, in prompt) ------------------------ */

static uint32_t tally_slot(uint32_t token, uint32_t capacity)
{
    uint32_t h = token * 0x9E3779B1u; /* capacity is a power of two: fold the high bits in */
    return (h ^ (h >> 16)) & (capacity - 1);
}

static kt_status tally_grow(struct kt_sampler *s, kt_err *err)
{
    uint32_t capacity = s->tally_capacity ? s->tally_capacity * 2 : 64;
    struct tally *t = malloc((size_t)capacity * sizeof *t);
    if (!t)
        return kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for %u token tallies",
                          capacity);
    for (uint32_t i = 0; i < capacity; i++)
        t[i] = (struct tally){.token = -1};
    for (uint32_t i = 0; i < s->tally_capacity; i++) {
        if (s->tallies[i].token < 0)
            continue;
        uint32_t j = tally_slot((uint32_t)s->tallies[i].token, capacity);
        while (t[j].token >= 0)
            j = (j + 1) & (capacity - 1);
        t[j] = s->tallies[i];
    }
    free(s->tallies);
    s->tallies = t;
    s->tally_capacity = capacity;
    return KT_OK;
}

/* The tally of token, created empty if absent; NULL when memory runs out. */
static struct tally *tally_get(struct kt_sampler *s, int32_t token, kt_err *err)
{
    if (2 * (s->n_tallies + 1) > s->tally_capacity && tally_grow(s, err) != KT_OK)
        return NULL;
    uint32_t j = tally_slot((uint32_t)token, s->tally_capacity);
    while (s->tallies[j].token >= 0 && s->tallies[j].token != token)
        j = (j + 1) & (s->tally_capacity - 1);
    if (s->tallies[j].token < 0) {
        s->tallies[j].token = token;
        s->n_tallies++;
    }
    return &s->tallies[j];
}

static const struct tally *tally_find(const struct kt_sampler *s, int32_t token)
{
    if (!s->tally_capacity)
        return NULL;
    uint32_t j = tally_slot((uint32_t)token, s->tally_capacity);
    while (s->tallies[j].token >= 0) {
        if (s->tallies[j].token == token)
            return &s->tallies[j];
        j = (j + 1) & (s->tally_capacity - 1);
    }
    return NULL;
}

static kt_status record_generated(struct kt_sampler *s, int32_t token, kt_err *err)
{
    struct tally *t = tally_get(s, token, err);
    if (!t)
        return KT_ERR_NOMEM;
    if (t->generated < UINT32_MAX)
        t->generated++;
    s->n_generated++;
    return KT_OK;
}

/* ---- create / destroy ------------------------------------------------------- */

kt_status kt_sampler_create(const struct kt_sampler_params *params, uint32_t n_vocab,
                            const int32_t *prompt, size_t n_prompt, struct kt_sampler **out,
                            kt_err *err)
{
    kt_status st;
    struct kt_sampler *s = NULL;
    if (!out)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: no output pointer");
    *out = NULL;
    if ((st = kt_sampler_params_validate(params, n_vocab, err)) != KT_OK)
        return st;
    if (n_prompt && !prompt)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: prompt is NULL with %zu tokens",
                          n_prompt);

    s = calloc(1, sizeof *s);
    if (!s) {
        st = kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory");
        goto fail;
    }
    s->params = *params;
    s->n_vocab = n_vocab;
    s->penalize = params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f ||
                  params->repetition_penalty != 1.0f;
    uint64_t seed = params->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);

    if (params->n_logit_bias) {
        s->bias = malloc(params->n_logit_bias * sizeof *s->bias);
        if (!s->bias) {
            st = kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for %zu logit biases",
                            params->n_logit_bias);
            goto fail;
        }
        memcpy(s->bias, params->logit_bias, params->n_logit_bias * sizeof *s->bias);
    }
    s->params.logit_bias = s->bias;

    for (size_t i = 0; i < n_prompt; i++) {
        if (!token_ok(s, prompt[i])) {
            st = kt_err_set(err, KT_ERR_INVALID,
                            "sampler: prompt token %zu (id %d) is outside the vocabulary of %u",
                            i, prompt[i], n_vocab);
            goto fail;
        }
    }
    /* Only the repetition penalty looks at the prompt. */
    if (params->repetition_penalty != 1.0f) {
        for (size_t i = 0; i < n_prompt; i++) {
            struct tally *t = tally_get(s, prompt[i], err);
            if (!t) {
                st = KT_ERR_NOMEM;
                goto fail;
            }
            t->in_prompt = true;
        }
    }
    *out = s;
    return KT_OK;

fail:
    kt_sampler_destroy(s);
    return st;
}

void kt_sampler_destroy(struct kt_sampler *s)
{
    if (!s)
        return;
    free(s->tallies);
    free(s->bias);
    free(s->banned);
    free(s->raw);
    free(s->candidates);
    free(s->heap);
    free(s);
}

uint64_t kt_sampler_n_generated(const struct kt_sampler *s)
{
    return s->n_generated;
}

uint32_t kt_sampler_generated_count(const struct kt_sampler *s, int32_t token)
{
    const struct tally *t = tally_find(s, token);
    return t ? t->generated : 0;
}

kt_status kt_sampler_accept(struct kt_sampler *s, int32_t token, kt_err *err)
{
    if (!token_ok(s, token))
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: accepted token %d is outside the vocabulary of %u", token,
                          s->n_vocab);
    return record_generated(s, token, err);
}

void kt_sampler_set_allowed(struct kt_sampler *s, const uint32_t *allowed)
{
    s->allowed = allowed;
}

kt_status kt_sampler_ban(struct kt_sampler *s, int32_t token, bool banned, kt_err *err)
{
    if (!token_ok(s, token))
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: banned token %d is outside the vocabulary of %u", token,
                          s->n_vocab);
    size_t i = 0;
    while (i < s->n_banned && s->banned[i] != token)
        i++;
    if (!banned) {
        if (i < s->n_banned)
            s->banned[i] = s->banned[--s->n_banned];
        return KT_OK;
    }
    if (i < s->n_banned)
        return KT_OK;
    if (s->n_banned == s->banned_capacity) {
        size_t capacity = s->banned_capacity ? 2 * s->banned_capacity : 8;
        int32_t *b = realloc(s->banned, capacity * sizeof *b);
        if (!b)
            return kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for banned tokens");
        s->banned = b;
        s->banned_capacity = capacity;
    }
    s->banned[s->n_banned++] = token;
    return KT_OK;
}

/* ---------------------------------------------------------------------------- */
/* whole-row passes, written so the compiler vectorises them                     */
/* ---------------------------------------------------------------------------- */

/* Independent accumulators the compiler maps onto SIMD lanes; they are
 * combined in a fixed order, so results never depend on the machine. */
#define LANES 8

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Floats as integers that order like the floats themselves (NaN aside):
 * negative floats have their magnitude bits flipped. */
static int32_t ordered_int(float f)
{
    int32_t i = (int32_t)float_bits(f);
    return i ^ ((i >> 31) & INT32_MAX);
}

static float ordered_float(int32_t i)
{
    return bits_float((uint32_t)(i ^ ((i >> 31) & INT32_MAX)));
}

/* True if some logit is NaN or +inf; *max_out gets the maximum otherwise.
 * Integer compares only, so the compiler vectorises it. */
static bool scan_row(const float *x, size_t n, float *max_out)
{
    int32_t lane_max[LANES];
    uint32_t bad = 0;
    for (int j = 0; j < LANES; j++)
        lane_max[j] = INT32_MIN;
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            const uint32_t bits = float_bits(x[i + j]);
            /* NaN, or +inf: magnitude >= inf, > inf when negative (-inf masks) */
            bad |= (int32_t)(bits & 0x7fffffffu) > (int32_t)(0x7f7fffffu + (bits >> 31));
            const int32_t key = ordered_int(x[i + j]);
            lane_max[j] = key > lane_max[j] ? key : lane_max[j];
        }
    }
    for (; i < n; i++) {
        const uint32_t bits = float_bits(x[i]);
        bad |= (int32_t)(bits & 0x7fffffffu) > (int32_t)(0x7f7fffffu + (bits >> 31));
        const int32_t key = ordered_int(x[i]);
        lane_max[0] = key > lane_max[0] ? key : lane_max[0];
    }
    int32_t max = INT32_MIN;
    for (int j = 0; j < LANES; j++)
        max = lane_max[j] > max ? lane_max[j] : max;
    *max_out = ordered_float(max);
    return bad != 0;
}

/*
 * e^x for x <= 0 (-inf included), within 1e-7 relative; 0 below -87, where
 * e^x leaves the normal floats.  e^x = 2^n e^r with |r| <= ln2/2, Cephes'
 * expf polynomial for e^r.  The selects are done on bits, not with float
 * compares, so the loop vectorises without -fno-trapping-math; e^0 is exactly 1.
 */
static inline float exp_nonpositive(float x)
{
    const uint32_t below_min = -(uint32_t)(float_bits(x) > 0xC2AE0000u); /* x < -87.0f */
    const float xc = bits_float((float_bits(x) & ~below_min) | (0xC2AE0000u & below_min));
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float t = xc * 1.44269504088896341f + shifter;
    const float n = t - shifter;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const float z = r * r;
    const float poly = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                          4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z +
                       r + 1.0f;
    const uint32_t two_n = (float_bits(t) - float_bits(shifter) + 127u) << 23; /* 2^n, n in [-126, 0] */
    return bits_float(float_bits(poly * bits_float(two_n)) & ~below_min);
}

/* w[i] = e^((x[i] - max) / T), in place: weights in [0, 1], exactly 1 at the maximum. */
static void weights_in_place(float *x, size_t n, float max, float inv_temperature)
{
    for (size_t i = 0; i < n; i++)
        x[i] = exp_nonpositive((x[i] - max) * inv_temperature);
}

/* The draw sums the row in blocks; a block's sum is computed the same way
 * every time, so the running total over blocks reproduces the total exactly. */
#define DRAW_BLOCK 256

static double sum_block(const float *w, size_t n)
{
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += w[i + j];
    double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; i++)
        sum += w[i];
    return sum;
}

static double sum_row(const float *w, size_t n)
{
    double total = 0.0;
    for (size_t b = 0; b < n; b += DRAW_BLOCK)
        total += sum_block(w + b, n - b < DRAW_BLOCK ? n - b : DRAW_BLOCK);
    return total;
}

/* The first token whose running weight exceeds target (< sum_row(w, n)). */
static uint32_t draw_from_row(const float *w, size_t n, double target)
{
    double running = 0.0;
    for (size_t b = 0; b < n; b += DRAW_BLOCK) {
        size_t len = n - b < DRAW_BLOCK ? n - b : DRAW_BLOCK;
        double block = sum_block(w + b, len);
        if (running + block > target) {
            /* block > target - running >= 0, so some weight here is positive */
            size_t last = b;
            for (size_t i = b; i < b + len; i++) {
                if (w[i] == 0.0f)
                    continue;
                running += w[i];
                last = i;
                if (running > target)
                    break;
            }
            return (uint32_t)last; /* also when rounding left running a hair short */
        }
        running += block;
    }
    /* target rounded up to the total: the last weighted token */
    size_t i = n;
    while (i > 0 && w[i - 1] == 0.0f)
        i--;
    return (uint32_t)(i - 1); /* the maximum has weight 1, so i > 0 */
}

/* ---------------------------------------------------------------------------- */
/* steps 1-3: validation, penalties, bias, bans                                  */
/* ---------------------------------------------------------------------------- */

/* The error for a row scan_row found NaN or +inf in, naming the first. */
static kt_status bad_logit_error(const float *logits, const char *who, kt_err *err)
{
    uint32_t i = 0;
    while (logits[i] < INFINITY)
        i++;
    return kt_err_set(err, KT_ERR_INVALID, "%s: logit of token %u is %s", who, i,
                      isnan(logits[i]) ? "NaN" : "+inf");
}

/* A penalised or biased logit may overflow; +inf would poison the softmax. */
static float cap_finite(float x)
{
    return x > FLT_MAX ? FLT_MAX : x;
}

/* Steps 1-3; *max_out gets the maximum adjusted logit. */
static kt_status adjust_row(struct kt_sampler *s, float *logits, float *max_out, kt_err *err)
{
    const uint32_t n = s->n_vocab;
    if (scan_row(logits, n, max_out))
        return bad_logit_error(logits, "sampler", err);
    bool adjusted = false;

    /* 2. penalties, in vLLM's order: repetition, frequency, presence. */
    if (s->penalize && s->n_tallies) {
        const float rep = s->params.repetition_penalty;
        const float freq = s->params.frequency_penalty;
        const float pres = s->params.presence_penalty;
        for (uint32_t j = 0; j < s->tally_capacity; j++) {
            const struct tally *t = &s->tallies[j];
            if (t->token < 0)
                continue;
            float x = logits[t->token];
            if (rep != 1.0f && (t->in_prompt || t->generated))
                x = x > 0.0f ? x / rep : x * rep;
            if (t->generated) {
                x -= freq * (float)t->generated;
                x -= pres;
            }
            logits[t->token] = cap_finite(x);
        }
        adjusted = true;
    }

    /* 3. bias, then bans. */
    for (size_t i = 0; i < s->params.n_logit_bias; i++)
        logits[s->bias[i].token] = cap_finite(logits[s->bias[i].token] + s->bias[i].bias);
    for (size_t i = 0; i < s->n_banned; i++)
        logits[s->banned[i]] = -INFINITY;
    if (s->allowed) {
        for (uint32_t w = 0; w < (n + 31) / 32; w++) {
            uint32_t keep = s->allowed[w];
            if (keep == UINT32_MAX)
                continue;
            uint32_t end = w * 32 + 32 < n ? w * 32 + 32 : n;
            for (uint32_t i = w * 32; i < end; i++)
                if (!((keep >> (i & 31)) & 1))
                    logits[i] = -INFINITY;
        }
    }
    adjusted = adjusted || s->params.n_logit_bias || s->n_banned || s->allowed;

    if (adjusted)
        scan_row(logits, n, max_out); /* no NaN or +inf can have appeared */
    return KT_OK;
}

kt_status kt_sampler_adjust_logits(struct kt_sampler *s, float *logits, kt_err *err)
{
    float max;
    if (!logits)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: no logits");
    return adjust_row(s, logits, &max, err);
}

/* ---------------------------------------------------------------------------- */
/* steps 5-8: truncation and the draw                                            */
/* ---------------------------------------------------------------------------- */

/*
 * Truncation compares floats through ordered_key, a uint32 that orders like
 * the float (NaN aside): integer compares vectorise without
 * -fno-trapping-math, and make radix selection possible.  top-k ranks tokens
 * by adjusted logit, top-p by weight (probability), both then by lower id.
 *
 * A prefix of such a ranking: token i belongs to it iff key(i) > key, or
 * key(i) == key and i <= id.  Every truncation keeps such a prefix, so the
 * intersection of two is the shorter one.
 */
struct rank_cut {
    uint32_t key;
    uint32_t id;
};

static const struct rank_cut CUT_ALL = {0, UINT32_MAX};

static uint32_t ordered_key(float f)
{
    return (uint32_t)ordered_int(f + 0.0f) ^ 0x80000000u; /* + 0: -0 ties with +0 */
}

static bool in_cut(uint32_t key, uint32_t id, struct rank_cut c)
{
    return key > c.key || (key == c.key && id <= c.id);
}

/* Keeps the ids of list (ascending, so it stays so) whose x lies inside cut. */
static uint32_t keep_in_cut(const float *x, uint32_t *list, uint32_t n, struct rank_cut cut)
{
    uint32_t kept = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t id = list[j];
        list[kept] = id;
        kept += in_cut(ordered_key(x[id]), id, cut);
    }
    return kept;
}

/* True if some of x[0 .. 16) has ordered_key >= min_key: one vectorised test.
 * The difference is taken in 64 bits, its sign says which side. */
static bool block_has_key_at_least(const float *x, uint32_t min_key)
{
    uint64_t any = 0;
    for (int j = 0; j < 16; j++)
        any |= (uint64_t)((int64_t)min_key - 1 - (int64_t)ordered_key(x[j]));
    return any >> 63;
}

/* Collects into list the ids of the row whose ordered_key is >= min_key,
 * skipping 16-token blocks that hold none. */
static uint32_t collect_row(const float *x, uint32_t n, uint32_t min_key, uint32_t *list)
{
    uint32_t kept = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        if (!block_has_key_at_least(x + i, min_key))
            continue;
        for (uint32_t j = i; j < i + 16; j++) {
            list[kept] = j;
            kept += ordered_key(x[j]) >= min_key;
        }
    }
    for (; i < n; i++) {
        list[kept] = i;
        kept += ordered_key(x[i]) >= min_key;
    }
    return kept;
}

/* ---- top-k for small k: a heap of the k best, one vectorised pass --------- */

/* a ranks below b: lower key, or the same key and a higher id. */
static bool ranks_below(struct ranked a, struct ranked b)
{
    return a.key < b.key || (a.key == b.key && a.id > b.id);
}

/* Restores the heap (lowest-ranked at the root) below slot i. */
static void heap_sift_down(struct ranked *heap, uint32_t size, uint32_t i)
{
    for (;;) {
        uint32_t low = i, l = 2 * i + 1, r = 2 * i + 2;
        if (l < size && ranks_below(heap[l], heap[low]))
            low = l;
        if (r < size && ranks_below(heap[r], heap[low]))
            low = r;
        if (low == i)
            return;
        struct ranked t = heap[i];
        heap[i] = heap[low];
        heap[low] = t;
        i = low;
    }
}

static int compare_ids(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The k best-ranked unmasked tokens of the row (logits), as ascending ids in
 * list.  Tokens come in id order, so one with the root's key ranks below it:
 * only strictly higher keys enter once the heap is full. */
static uint32_t top_k_by_heap(struct ranked *heap, const float *x, uint32_t n, uint32_t k,
                              uint32_t *list)
{
    const uint32_t masked = ordered_key(-INFINITY);
    uint32_t size = 0, i = 0;
    for (; i < n && size < k; i++) {
        const uint32_t key = ordered_key(x[i]);
        if (key == masked)
            continue;
        uint32_t j = size++;
        heap[j] = (struct ranked){key, i};
        while (j > 0 && ranks_below(heap[j], heap[(j - 1) / 2])) {
            struct ranked t = heap[j];
            heap[j] = heap[(j - 1) / 2];
            heap[(j - 1) / 2] = t;
            j = (j - 1) / 2;
        }
    }
    for (; i < n; i += 16) {
        const uint32_t len = n - i < 16 ? n - i : 16;
        if (len == 16 && !block_has_key_at_least(x + i, heap[0].key + 1))
            continue;
        for (uint32_t j = i; j < i + len; j++) {
            const uint32_t key = ordered_key(x[j]);
            if (key > heap[0].key) {
                heap[0] = (struct ranked){key, j};
                heap_sift_down(heap, size, 0);
            }
        }
    }
    for (uint32_t j = 0; j < size; j++)
        list[j] = heap[j].id;
    qsort(list, size, sizeof *list, compare_ids);
    return size;
}

/* ---- radix selection: top-k for large k, top-p ----------------------------- */

/*
 * The shortest prefix of the ranking (by ordered_key of x) of the candidates
 * whose count (by_mass false) or weight (by_mass true; x are then weights)
 * reaches goal; CUT_ALL when all of them are needed.  Candidates are
 * list[0 .. *n) (ascending ids), or the whole row when from_row.  On return,
 * list (which must hold n_vocab ids) holds the candidates at or above the
 * boundary, ascending, and *n their number.
 *
 * Level 0 histograms the top 12 bits of the keys over every candidate; only
 * the boundary bucket and those above it are kept, and levels 1 and 2 (12
 * and 8 bits) look at those few.  After the last digit the boundary key is
 * exact; its ties are taken in id order.
 */
static struct rank_cut rank_select(struct kt_sampler *s, const float *x, bool from_row,
                                   uint32_t *list, uint32_t *n, bool by_mass, double goal)
{
    static const int shift[3] = {20, 8, 0};
    static const int width[3] = {12, 12, 8};
    double *value = s->bucket_value;
    uint32_t *count = s->bucket_count;
    uint32_t prefix = 0, prefix_mask = 0;
    double need = goal;
    bool take_all_ties = false;

    for (int level = 0; level < 3; level++) {
        const uint32_t n_buckets = 1u << width[level], digit_mask = n_buckets - 1;
        const bool row = level == 0 && from_row;
        const uint32_t n_cand = row ? s->n_vocab : *n;
        memset(value, 0, n_buckets * sizeof *value);
        memset(count, 0, n_buckets * sizeof *count);
        for (uint32_t j = 0; j < n_cand; j++) {
            const float v = x[row ? j : list[j]];
            const uint32_t key = ordered_key(v);
            if ((key & prefix_mask) != prefix)
                continue;
            const uint32_t b = (key >> shift[level]) & digit_mask;
            count[b]++;
            if (by_mass)
                value[b] += v;
        }
        if (!by_mass)
            for (uint32_t b = 0; b < n_buckets; b++)
                value[b] = count[b];
        if (level == 0) {
            double total = 0.0;
            for (uint32_t b = 0; b < n_buckets; b++)
                total += value[b];
            if (total <= need) {
                if (from_row)
                    *n = collect_row(x, s->n_vocab, 0, list); /* every token */
                return CUT_ALL;
            }
        }
        int64_t chosen = -1, lowest = -1;
        for (int64_t b = digit_mask; b >= 0; b--) {
            if (!count[b])
                continue;
            lowest = b;
            if (value[b] >= need) {
                chosen = b;
                break;
            }
            need -= value[b];
        }
        if (chosen < 0) {
            /* Rounding left a sliver of the goal unreached: keep the last bucket whole. */
            chosen = lowest;
            need = value[lowest];
        }
        prefix |= (uint32_t)chosen << shift[level];
        prefix_mask |= digit_mask << shift[level];
        take_all_ties = value[chosen] <= need;
        if (level == 0) {
            /* Only the boundary bucket and what ranks above it can survive. */
            const uint32_t min_key = (uint32_t)chosen << shift[0];
            if (from_row) {
                *n = collect_row(x, s->n_vocab, min_key, list);
            } else {
                uint32_t kept = 0;
                for (uint32_t j = 0; j < *n; j++) {
                    list[kept] = list[j];
                    kept += ordered_key(x[list[j]]) >= min_key;
                }
                *n = kept;
            }
        }
    }

    struct rank_cut cut = {prefix, UINT32_MAX};
    if (take_all_ties)
        return cut;
    double taken = 0.0;
    for (uint32_t j = 0; j < *n; j++) {
        if (ordered_key(x[list[j]]) != prefix)
            continue;
        cut.id = list[j];
        taken += by_mass ? (double)x[list[j]] : 1.0;
        if (taken >= need)
            break;
    }
    return cut;
}

/* Top-k up to this size keeps a heap; beyond, radix selection is cheaper. */
#define HEAP_TOP_K_MAX 1024

/* The weight (see weights_in_place) of each listed token, in place. */
static void weights_in_list(float *x, const uint32_t *list, uint32_t n, float max,
                            float inv_temperature)
{
    for (uint32_t j = 0; j < n; j++)
        x[list[j]] = exp_nonpositive((x[list[j]] - max) * inv_temperature);
}

/*
 * Steps 4-8 on the adjusted row (n_vocab logits whose maximum is max,
 * overwritten): the token drawn for the uniform u, and its log-probability
 * among the survivors.  Survivors become an ascending id list as soon as a
 * step cuts the row.  Only top-p needs every token's weight (its total);
 * top-k and min-p pick their candidates from the logits, and only those
 * are turned into weights.
 */
static kt_status draw(struct kt_sampler *s, float *row, float max, double u, uint32_t *token_out,
                      double *logprob, kt_err *err)
{
    const struct kt_sampler_params *p = &s->params;
    const uint32_t n = s->n_vocab;
    const float inv_t = 1.0f / p->temperature;
    const bool top_k = p->top_k > 0 && (uint32_t)p->top_k < n;
    bool top_p = p->top_p < 1.0f;
    const bool min_p = p->min_p > 0.0f;

    if (!top_k && !top_p && !min_p) {
        weights_in_place(row, n, max, inv_t);
        const double total = sum_row(row, n);
        *token_out = draw_from_row(row, n, u * total);
        *logprob = log((double)row[*token_out] / total);
        return KT_OK;
    }

    if (!s->candidates && !(s->candidates = malloc((size_t)n * sizeof *s->candidates)))
        return kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for %u candidates", n);
    if (top_k && p->top_k <= HEAP_TOP_K_MAX && !s->heap &&
        !(s->heap = malloc((size_t)p->top_k * sizeof *s->heap)))
        return kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for a top-k heap");
    uint32_t *list = s->candidates, n_list = 0;

    if (top_k) {
        /* 5. on the logits; then only the k survivors get weights. */
        if (p->top_k <= HEAP_TOP_K_MAX) {
            n_list = top_k_by_heap(s->heap, row, n, (uint32_t)p->top_k, list);
        } else {
            struct rank_cut cut = rank_select(s, row, true, list, &n_list, false, p->top_k);
            n_list = keep_in_cut(row, list, n_list, cut);
        }
        weights_in_list(row, list, n_list, max, inv_t);
    } else if (top_p) {
        /* 6. top-p over the row.  A token lighter than (1 - p) total / n_vocab
         * has less than 1 - p of the weight ranked at or below it, so it is
         * out (halved for rounding): the radix only sees the rest, and with
         * them all that ranks above them; the total is the row's. */
        weights_in_place(row, n, max, inv_t);
        const double total = sum_row(row, n);
        const float floor_weight =
            fmaxf((float)(0.5 * (1.0 - (double)p->top_p) * total / n), FLT_TRUE_MIN);
        n_list = collect_row(row, n, ordered_key(floor_weight), list);
        struct rank_cut cut = rank_select(s, row, false, list, &n_list, true, p->top_p * total);
        n_list = keep_in_cut(row, list, n_list, cut);
        top_p = false;
    } else {
        /* 7. min-p alone: candidates from a logit bound a little below
         * min_p's (by 1e-3 in log weight, then two float steps for the
         * rounding of the bound); min-p itself is applied to their weights. */
        float bound = (float)((double)max + (double)p->temperature * (log((double)p->min_p) - 1e-3));
        bound = nextafterf(nextafterf(bound, -INFINITY), -INFINITY);
        n_list = collect_row(row, n, ordered_key(bound), list);
        weights_in_list(row, list, n_list, max, inv_t);
    }
    if (top_p) {
        /* 6. top-p inside the top k. */
        double total = 0.0;
        for (uint32_t j = 0; j < n_list; j++)
            total += row[list[j]];
        struct rank_cut cut = rank_select(s, row, false, list, &n_list, true, p->top_p * total);
        n_list = keep_in_cut(row, list, n_list, cut);
    }
    if (min_p) /* 7. the maximum weighs exactly 1 */
        n_list = keep_in_cut(row, list, n_list, (struct rank_cut){ordered_key(p->min_p), UINT32_MAX});

    /* 8. walk the survivors in id order (the maximum always survives). */
    double total = 0.0;
    for (uint32_t j = 0; j < n_list; j++)
        total += row[list[j]];
    const double target = u * total;
    double running = 0.0;
    uint32_t token = UINT32_MAX;
    for (uint32_t j = 0; j < n_list; j++) {
        if (row[list[j]] == 0.0f)
            continue; /* top-k may keep weightless tokens; never draw one */
        running += row[list[j]];
        token = list[j];
        if (running > target)
            break; /* else target rounded up to total: the last weighted token */
    }
    *token_out = token;
    *logprob = log((double)row[token] / total);
    return KT_OK;
}

/* ---------------------------------------------------------------------------- */
/* sampling                                                                      */
/* ---------------------------------------------------------------------------- */

kt_status kt_sampler_sample_logprobs(struct kt_sampler *s, float *logits, uint32_t n_top,
                                     int32_t *token_out, struct kt_logprobs *lp, kt_err *err)
{
    kt_status st;
    const uint32_t n = s->n_vocab;
    const struct kt_sampler_params *p = &s->params;
    if (!logits || !token_out)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: no logits or no output token");
    if (lp && n_top > KT_LOGPROBS_MAX_TOP)
        return kt_err_set(err, KT_ERR_INVALID, "sampler: top_logprobs must be <= %d (got %u)",
                          KT_LOGPROBS_MAX_TOP, n_top);
    if (lp) {
        if (!s->raw && !(s->raw = malloc((size_t)n * sizeof *s->raw)))
            return kt_err_set(err, KT_ERR_NOMEM, "sampler: out of memory for a logits copy");
        memcpy(s->raw, logits, (size_t)n * sizeof *s->raw);
    }
    float max;
    if ((st = adjust_row(s, logits, &max, err)) != KT_OK)
        return st;
    if (max == -INFINITY)
        return kt_err_set(err, KT_ERR_INVALID,
                          "sampler: every token is masked (all %u logits are -inf)", n);

    uint32_t token = 0;
    double sampled_logprob = 0.0;
    /* 4. greedy; top_k = 1 is greedy by definition. */
    if (p->temperature < KT_SAMPLER_GREEDY_TEMPERATURE || p->top_k == 1) {
        while (logits[token] != max)
            token++;
    } else if ((st = draw(s, logits, max, xoshiro_uniform(s->rng), &token, &sampled_logprob,
                          err)) != KT_OK) {
        return st;
    }

    if ((st = record_generated(s, (int32_t)token, err)) != KT_OK)
        return st;
    *token_out = (int32_t)token;
    if (lp) {
        if ((st = kt_logprobs_compute(s->raw, n, (int32_t)token, n_top, lp, err)) != KT_OK)
            return st;
        lp->sampled_logprob = (float)sampled_logprob;
    }
    return KT_OK;
}

kt_status kt_sampler_sample(struct kt_sampler *s, float *logits, int32_t *token_out, kt_err *err)
{
    return kt_sampler_sample_logprobs(s, logits, 0, token_out, NULL, err);
}

/* ---------------------------------------------------------------------------- */
/* log-probabilities                                                             */
/* ---------------------------------------------------------------------------- */

/* e^(x - max) summed over the row, in fixed double lanes. */
static double sum_exp_row(const float *x, size_t n, float max)
{
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += exp_nonpositive(x[i + j] - max);
    double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; i++)
        sum += exp_nonpositive(x[i] - max);
    return sum;
}

/* Inserts (id, x) into top[0 .. *kept), sorted by x descending, at most n_top
 * long; ids arrive ascending, so an equal x goes after (lower id first). */
static void top_insert(struct kt_token_logprob *top, uint32_t *kept, uint32_t n_top, uint32_t id,
                       float x)
{
    uint32_t j = *kept < n_top ? (*kept)++ : *kept - 1;
    while (j > 0 && x > top[j - 1].logprob) {
        top[j] = top[j - 1];
        j--;
    }
    top[j] = (struct kt_token_logprob){(int32_t)id, x};
}

kt_status kt_logprobs_compute(const float *logits, uint32_t n_vocab, int32_t token,
                              uint32_t n_top, struct kt_logprobs *out, kt_err *err)
{
    if (!logits || !out || n_vocab == 0)
        return kt_err_set(err, KT_ERR_INVALID, "logprobs: no logits or no output");
    if (token < 0 || (uint32_t)token >= n_vocab)
        return kt_err_set(err, KT_ERR_INVALID,
                          "logprobs: token %d is outside the vocabulary of %u", token, n_vocab);
    if (n_top > KT_LOGPROBS_MAX_TOP)
        return kt_err_set(err, KT_ERR_INVALID, "logprobs: top_logprobs must be <= %d (got %u)",
                          KT_LOGPROBS_MAX_TOP, n_top);
    if (n_top > n_vocab)
        n_top = n_vocab;

    float max;
    if (scan_row(logits, n_vocab, &max))
        return bad_logit_error(logits, "logprobs", err);
    if (max == -INFINITY)
        return kt_err_set(err, KT_ERR_INVALID,
                          "logprobs: every token is masked (all %u logits are -inf)", n_vocab);
    const double log_z = (double)max + log(sum_exp_row(logits, n_vocab, max));

    /* The n_top best, by insertion; once full, 16-token blocks with no
     * logit above the last entry are skipped with one vectorised test. */
    uint32_t kept = 0, i = 0;
    for (; i < n_vocab && kept < n_top; i++)
        top_insert(out->top, &kept, n_top, i, logits[i]);
    for (; kept && i < n_vocab; i += 16) {
        const uint32_t len = n_vocab - i < 16 ? n_vocab - i : 16;
        if (len == 16) {
            /* top bit set where key > last (keys are ordered_int: the
             * difference of two int32 is taken in int64 to avoid overflow) */
            const int64_t last = ordered_int(out->top[kept - 1].logprob);
            uint64_t any = 0;
            for (int j = 0; j < 16; j++)
                any |= (uint64_t)(last - ordered_int(logits[i + j]));
            if (!(any >> 63))
                continue;
        }
        for (uint32_t j = i; j < i + len; j++)
            if (logits[j] > out->top[kept - 1].logprob)
                top_insert(out->top, &kept, n_top, j, logits[j]);
    }

    out->token = token;
    out->logprob = (float)((double)logits[token] - log_z);
    out->sampled_logprob = out->logprob;
    out->n_top = kept;
    for (uint32_t j = 0; j < kept; j++)
        out->top[j].logprob = (float)((double)out->top[j].logprob - log_z);
    return KT_OK;
}

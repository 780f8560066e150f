/*
 * sampler.h - choosing a sequence's next token from a row of logits.
 *
 * A kt_sampler is one sequence's sampling state: its parameters, its own RNG
 * (xoshiro256** seeded through splitmix64 from params.seed), how often it has
 * generated each token, which tokens its prompt held, and which tokens are
 * banned right now.  Same parameters + same seed + same logits rows give the
 * same tokens on any machine.  It never reads a clock (a caller without a
 * user seed passes one), never prints, and keeps no global state: a sampler
 * is used by one thread at a time, different samplers by any number of them.
 *
 * What one kt_sampler_sample call does to a row, in this order:
 *   1. reject NaN and +inf logits (KT_ERR_INVALID; -inf means "masked")
 *   2. penalties: repetition over prompt + generated tokens (positive logits
 *      divided, others multiplied), then frequency and presence over the
 *      generated tokens: logit -= frequency * count + presence * (count > 0)
 *   3. logit bias (added), then banned tokens set to -inf
 *   4. temperature below KT_SAMPLER_GREEDY_TEMPERATURE, or top_k = 1: argmax,
 *      lowest id on ties, and stop here; otherwise divide by the temperature
 *   5. top-k, 6. top-p over the top-k tokens renormalised, 7. min-p
 *   8. draw from the softmax of the tokens left.
 * top-k ranks tokens by adjusted logit, top-p by probability, both then by
 * lower id: exactly k tokens survive top-k, and top-p keeps the shortest
 * ranked prefix whose probability reaches top_p.  min-p keeps the tokens
 * with p >= min_p * p_max.  (vLLM V1 adds logit bias before the penalties
 * and applies min-p before top-k/top-p; the results differ only when those
 * steps interact.)
 *
 * Log-probabilities (OpenAI logprobs / top_logprobs) are those of the RAW
 * logits, before penalties, bias and temperature: vLLM's default
 * "raw_logprobs" mode.  The log-probability of the draw under the processed
 * distribution comes alongside as sampled_logprob.
 */
#ifndef KT_SAMPLER_H
#define KT_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Temperatures below this sample greedily (vLLM's _SAMPLING_EPS). */
#define KT_SAMPLER_GREEDY_TEMPERATURE 1e-5f
/* OpenAI's top_logprobs limit. */
#define KT_LOGPROBS_MAX_TOP 20

struct kt_logit_bias {
    int32_t token;
    float bias; /* added to the logit; finite */
};

struct kt_sampler_params {
    float temperature;        /* >= 0; 0 (below 1e-5): greedy */
    int32_t top_k;            /* 0 or -1: off; >= n_vocab: off */
    float top_p;              /* (0, 1]; 1: off */
    float min_p;              /* [0, 1]; 0: off */
    float presence_penalty;   /* [-2, 2]; OpenAI semantics, generated tokens only */
    float frequency_penalty;  /* [-2, 2]; OpenAI semantics, generated tokens only */
    float repetition_penalty; /* > 0; 1: off; HF/vLLM semantics, prompt + generated */
    uint64_t seed;
    const struct kt_logit_bias *logit_bias; /* n_logit_bias entries, copied at create; repeats add */
    size_t n_logit_bias;
};

/* Temperature 1, every filter and penalty off, seed 0, no bias. */
struct kt_sampler_params kt_sampler_params_default(void);

/* KT_ERR_INVALID with a message naming the parameter when one is out of its
 * range (or a bias token is outside [0, n_vocab)). */
kt_status kt_sampler_params_validate(const struct kt_sampler_params *params, uint32_t n_vocab,
                                     kt_err *err);

struct kt_sampler;

/* prompt (n_prompt ids, may be NULL when 0) feeds the repetition penalty.
 * Memory: ~50 KiB, the distinct tokens seen, and on first use 4 n_vocab
 * bytes of candidate ids (truncation) and of raw logits (logprobs). */
kt_status kt_sampler_create(const struct kt_sampler_params *params, uint32_t n_vocab,
                            const int32_t *prompt, size_t n_prompt, struct kt_sampler **out,
                            kt_err *err);
void kt_sampler_destroy(struct kt_sampler *s);

/* Steps 1-8 above on logits (n_vocab floats, overwritten), then records the
 * token as generated.  KT_ERR_INVALID on NaN/+inf or when every token is -inf. */
kt_status kt_sampler_sample(struct kt_sampler *s, float *logits, int32_t *token_out, kt_err *err);

struct kt_token_logprob {
    int32_t token;
    float logprob;
};

struct kt_logprobs {
    int32_t token;         /* the token described */
    float logprob;         /* raw log-softmax at token; -INFINITY where the logit is -inf */
    float sampled_logprob; /* log-probability of token in the distribution it was drawn
                            * from (0 for greedy); equals logprob from kt_logprobs_compute */
    uint32_t n_top;
    struct kt_token_logprob top[KT_LOGPROBS_MAX_TOP]; /* raw; highest first, lower id on ties */
};

/* kt_sampler_sample, also filling lp for the chosen token with the n_top
 * (<= KT_LOGPROBS_MAX_TOP) most likely raw tokens.  lp may be NULL. */
kt_status kt_sampler_sample_logprobs(struct kt_sampler *s, float *logits, uint32_t n_top,
                                     int32_t *token_out, struct kt_logprobs *lp, kt_err *err);

/* Raw log-probabilities of one logits row (not modified): for token and the
 * n_top most likely tokens.  For prompt logprobs (echo) and for the above. */
kt_status kt_logprobs_compute(const float *logits, uint32_t n_vocab, int32_t token,
                              uint32_t n_top, struct kt_logprobs *out, kt_err *err);

/* Steps 1-3 alone, in place: what greedy takes the argmax of. */
kt_status kt_sampler_adjust_logits(struct kt_sampler *s, float *logits, kt_err *err);

/* Records a token appended without sampling (forced, or replayed). */
kt_status kt_sampler_accept(struct kt_sampler *s, int32_t token, kt_err *err);

/* Bans (logit -inf) or unbans a token from the next samples on, e.g. EOS
 * until min_tokens have been generated. */
kt_status kt_sampler_ban(struct kt_sampler *s, int32_t token, bool banned, kt_err *err);

/* Restricts the samples from now on to the tokens whose bit is set in allowed
 * (n_vocab bits: bit id % 32 of word id / 32), e.g. a grammar's mask
 * (grammar.h); NULL allows every token again.  The bits are the caller's and
 * are read at every sample until this is called again.  Applied with the
 * bans in step 3, so greedy and drawn samples alike pick only allowed tokens;
 * logprobs stay those of the raw logits. */
void kt_sampler_set_allowed(struct kt_sampler *s, const uint32_t *allowed);

/* Tokens recorded as generated so far, and how often one of them was. */
uint64_t kt_sampler_n_generated(const struct kt_sampler *s);
uint32_t kt_sampler_generated_count(const struct kt_sampler *s, int32_t token);

#endif

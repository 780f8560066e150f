/*
 * route.h - what makes a synthetic model's routing realistic enough to plan
 * for (internal to tools/synth): layers that differ in concentration
 * (--route-skew) and routing that depends on the input (--route-input).
 *
 * Concentration.  Each MoE layer gets its own Zipf exponent of router
 * preference, evenly spaced over [skew, skew_max] and handed to the layers in
 * a seeded order (so concentration is not monotonic in depth); init.c fits
 * exp_probs_b to it.
 *
 * Input.  Every normal token belongs to a class by its bytes (prose words,
 * code symbols, code words and indentation, digits, other scripts).  With
 * route_input R a token's embedding row is sqrt(1-R) parts noise and sqrt(R)
 * parts its class's direction (orthonormal seeded vectors), and each router
 * row gains a seeded affinity of its expert for each class along those
 * directions, so a share R (2 - R) of a router logit's variance is fixed by
 * the token's class (0.75 at R = 0.5) while the logit stays ~N(0, 1) over
 * tokens.  Tokens of a class therefore prefer the same experts, per layer,
 * and a prompt set of code routes to other experts than one of prose.
 *
 * Context.  Attention carries the context's non-prose classes part way into
 * each position (attn_kv_a_mqa reads them into three latent dims, attn_v_b
 * copies them, attn_output writes them back along the class directions), so
 * a word in a code prompt routes partly like code.  Prose is the default and
 * is not carried, or the chat template's system text would wash the rest
 * out.  R = 0 leaves every tensor as it always was.
 */
#ifndef KT_SYNTH_ROUTE_H
#define KT_SYNTH_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

enum kt_synth_token_class {
    KT_SYNTH_CLASS_PROSE,  /* letters and prose punctuation: " the", "ing", "." */
    KT_SYNTH_CLASS_CODE,   /* code symbols, alone or in a word ("(", "_t", "->"), tabs, runs of spaces */
    KT_SYNTH_CLASS_DIGITS, /* numbers without letters: "201", "3.5" */
    KT_SYNTH_CLASS_SCRIPT, /* any byte >= 0x80: CJK, Cyrillic, accents, emoji */
    KT_SYNTH_CLASS_COUNT,
    KT_SYNTH_CLASS_NONE = KT_SYNTH_CLASS_COUNT, /* specials, newlines, single spaces: no direction */
};

/* The class of a token from its byte-level text (the GGUF form, "Ġthe") and
 * its kt_token_type; NONE for anything but a normal token. */
enum kt_synth_token_class kt_synth_token_class(const char *byte_level_text, int32_t token_type);

#endif

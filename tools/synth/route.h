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
 * code symbols and indentation, digits, other scripts).  With route_input R
 * a token's embedding row is sqrt(1-R) parts noise and sqrt(R) parts its
 * class's direction (orthonormal seeded vectors), so a share R of a router
 * logit's variance is fixed by the token's class (router rows stay random:
 * w.u_c differs per expert, class and layer).  Tokens of a class therefore
 * prefer the same experts, and a prompt set made of code routes to other
 * experts than one of prose.  R = 0 leaves token_embd as it always was.
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

/*
 * kv_type.h - the --kv-type option kt-run, kt-bench and kt-serve share: the
 * element type of the latent KV cache's rows (runtime/forward/kv_cache.h).
 *
 * BF16 is the default: it halves the cache against F32 and its logits stay
 * within the tolerance tests/test_forward.c states and measures
 * (kv_cache_row_types_match_f32_within_tolerance); F32 stays available for
 * bit-exact comparisons, F16 keeps 3 more mantissa bits in a narrower range.
 */
#ifndef KT_TOOL_KV_TYPE_H
#define KT_TOOL_KV_TYPE_H

#include <stdbool.h>
#include <stddef.h>

#include "cpu/ref/ops.h"

#define KT_TOOL_DEFAULT_KV_TYPE KT_ROW_BF16

/* "f32", "bf16" or "f16" (any case) -> *out; else false, why naming the
 * option (--kv-type), the value and the choices. */
bool kt_tool_parse_kv_type(const char *arg, enum kt_row_type *out, char *why, size_t why_size);

#endif

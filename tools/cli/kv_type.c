/*
 * kv_type.c - --kv-type for the tools (see kv_type.h).
 */
#include "kv_type.h"

#include <stdio.h>

bool kt_tool_parse_kv_type(const char *arg, enum kt_row_type *out, char *why, size_t why_size)
{
    if (kt_row_type_parse(arg, out))
        return true;
    snprintf(why, why_size, "--kv-type '%s' is not a KV cache type: give f32, bf16 or f16", arg ? arg : "");
    return false;
}

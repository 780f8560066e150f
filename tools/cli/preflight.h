/*
 * preflight.h - what a tool checks before it reads a single weight: that
 * the files it will write can be written, and that a context length fits
 * the engine and the model.  Loading a real model takes minutes; a refusal
 * that comes after it wastes them.  Messages name the option, the value,
 * the limit and the fix.
 */
#ifndef KT_TOOL_PREFLIGHT_H
#define KT_TOOL_PREFLIGHT_H

#include <stdint.h>

#include "model.h"
#include "status.h"

/* The engine's most positions per sequence (engine.c refuses more). */
#define KT_TOOL_MAX_CTX (1u << 24)
/* The context a tool runs at without --ctx: the model's, at most this. */
#define KT_TOOL_DEFAULT_CTX 4096u

/* KT_OK when a file can be created at path (its folder exists and can be
 * written); else why, naming option ("--logits-out") and the folder. */
kt_status kt_tool_check_writable(const char *option, const char *path, kt_err *err);

/* The context a tool runs m at: ctx, or 0 for the default (the model's
 * context_length, at most KT_TOOL_DEFAULT_CTX). */
uint32_t kt_tool_context(const struct kt_model *m, uint32_t ctx);

/* KT_OK when --ctx ctx (0: the default) is within the model's own
 * context_length (a model that states one); else why, naming the model
 * file (path) and the largest --ctx it takes. */
kt_status kt_tool_check_context(const char *option, uint32_t ctx, const struct kt_model *m, const char *path,
                                kt_err *err);

/* KT_OK when a run needing `positions` per sequence fits the engine and the
 * model's context_length; else "WHAT need N positions, more than ...: FIX". */
kt_status kt_tool_check_positions(const char *what, uint64_t positions, const struct kt_model *m, const char *path,
                                  const char *fix, kt_err *err);

#endif

/*
 * json_schema.h - JSON Schema compiled into grammar.h nodes, for structured
 * outputs (OpenAI's response_format json_schema, vLLM's guided_json) and
 * tool-call arguments.
 *
 * The subset is the one OpenAI accepts with strict: true, less `format`:
 *   type (a name or an array of names): object, array, string, number,
 *   integer, boolean, null; properties, required, additionalProperties;
 *   items, minItems, maxItems; minLength, maxLength; pattern (grammar.c's
 *   regex subset, not together with a length); enum, const; anyOf;
 *   allOf of one schema; $ref to "#" or a JSON pointer into the document
 *   ($defs, definitions; recursion allowed); true and {} (any value).
 * Objects are written with their properties in the schema's order, the
 * required ones always and the optional ones when the model picks them; no
 * other keys (valid whatever additionalProperties says, since extra keys are
 * only ever allowed, never needed).  An object with no properties is any
 * object whose values match additionalProperties (a schema, or anything).
 * Keywords that constrain what the grammar cannot enforce (format,
 * minimum, maximum, multipleOf, oneOf, not, uniqueItems, prefixItems, ...)
 * are refused; other unknown keywords are annotations and ignored.
 *
 * Errors name the place as a JSON pointer into the schema ("#/properties/
 * age/type: ..."); the library never prints.
 */
#ifndef KT_JSON_SCHEMA_H
#define KT_JSON_SCHEMA_H

#include <stdint.h>

#include <jansson.h>

#include "grammar.h"
#include "status.h"

/* Compiles schema's value into g (*node).  KT_ERR_INVALID for a schema that
 * is wrong, KT_ERR_UNSUPPORTED for one beyond the subset, both with the
 * pointer first in the message. */
kt_status kt_json_schema_compile(struct kt_grammar *g, const json_t *schema, uint32_t *node, kt_err *err);

/* Any JSON value; any JSON object (response_format json_object). */
kt_status kt_json_any_value(struct kt_grammar *g, uint32_t *node, kt_err *err);
kt_status kt_json_any_object(struct kt_grammar *g, uint32_t *node, kt_err *err);

#endif

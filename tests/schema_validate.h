/*
 * schema_validate.h - a JSON Schema validator for the subset kt's structured
 * outputs take (json_schema.h), written from the JSON Schema rules and not
 * from the compiler, for the tests that check constrained output against
 * its schema.  Header-only: each test program includes it once.
 */
#ifndef KT_SCHEMA_VALIDATE_H
#define KT_SCHEMA_VALIDATE_H

#include <jansson.h>
#include <stdbool.h>
#include <string.h>


static inline size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static inline bool validate(const json_t *root, const json_t *s, const json_t *v, int depth);

static inline bool validate_type(const json_t *root, const json_t *s, const char *t, const json_t *v, int depth)
{
    if (strcmp(t, "string") == 0) {
        if (!json_is_string(v))
            return false;
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        return (!mn || (json_int_t)n >= json_integer_value(mn)) && (!mx || (json_int_t)n <= json_integer_value(mx));
    }
    if (strcmp(t, "integer") == 0)
        return json_is_integer(v);
    if (strcmp(t, "number") == 0)
        return json_is_number(v);
    if (strcmp(t, "boolean") == 0)
        return json_is_boolean(v);
    if (strcmp(t, "null") == 0)
        return json_is_null(v);
    if (strcmp(t, "array") == 0) {
        if (!json_is_array(v))
            return false;
        const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        json_int_t n = (json_int_t)json_array_size(v);
        if ((mn && n < json_integer_value(mn)) || (mx && n > json_integer_value(mx)))
            return false;
        const json_t *items = json_object_get(s, "items");
        for (size_t i = 0; items && i < json_array_size(v); i++)
            if (!validate(root, items, json_array_get(v, i), depth + 1))
                return false;
        return true;
    }
    if (strcmp(t, "object") == 0) {
        if (!json_is_object(v))
            return false;
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        const json_t *extra = json_object_get(s, "additionalProperties");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i))))
                return false;
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            const json_t *ps = json_object_get(props, k);
            if (ps) {
                if (!validate(root, ps, x, depth + 1))
                    return false;
            } else if (json_is_false(extra)) {
                return false;
            } else if (json_is_object(extra) && !validate(root, extra, x, depth + 1)) {
                return false;
            }
        }
        return true;
    }
    return false;
}

static inline bool validate(const json_t *root, const json_t *s, const json_t *v, int depth)
{
    if (depth > 100)
        return false;
    if (json_is_true(s))
        return true;
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        const char *r = json_string_value(ref);
        const json_t *target = root;
        if (strncmp(r, "#/$defs/", 8) == 0)
            target = json_object_get(json_object_get(root, "$defs"), r + 8);
        return target && validate(root, target, v, depth + 1);
    }
    const json_t *any = json_object_get(s, "anyOf");
    if (any) {
        for (size_t i = 0; i < json_array_size(any); i++)
            if (validate(root, json_array_get(any, i), v, depth + 1))
                return true;
        return false;
    }
    const json_t *c = json_object_get(s, "const");
    if (c && !json_equal(c, v))
        return false;
    const json_t *e = json_object_get(s, "enum");
    if (e) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(e) && !found; i++)
            found = json_equal(json_array_get(e, i), v);
        if (!found)
            return false;
    }
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t))
        return validate_type(root, s, json_string_value(t), v, depth);
    if (json_is_array(t)) {
        for (size_t i = 0; i < json_array_size(t); i++)
            if (validate_type(root, s, json_string_value(json_array_get(t, i)), v, depth))
                return true;
        return false;
    }
    return true;
}

#endif

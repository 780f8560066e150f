/*
 * yaml_tree.h - a YAML document read into a small tree whose every node knows
 * its line and column, for configs that must name where a mistake is.
 *
 * Built from libyaml's event stream, not its document loader, so hostile input
 * stays cheap: anchors, aliases and tags are refused (no alias expansion, no
 * cycles), nesting, node counts and mapping sizes are bounded, a second
 * document is refused and mapping keys must be unique scalars.  Internal to
 * placement/.
 */
#ifndef KT_YAML_TREE_H
#define KT_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

enum kt_ynode_kind { KT_YSCALAR, KT_YSEQ, KT_YMAP };

struct kt_ynode {
    enum kt_ynode_kind kind;
    uint32_t line, col;           /* 1-based, where the node starts */
    /* scalars */
    bool plain;                   /* unquoted: only plain scalars read as numbers */
    char *text;                   /* NUL-terminated; may hold NULs ("\0" escapes): use len */
    size_t len;
    /* sequences: items[0..n); mappings: items[2i] is a key (a scalar), items[2i+1] its value */
    uint32_t n;
    struct kt_ynode **items;
};

#define KT_YAML_MAX_DEPTH 32
#define KT_YAML_MAX_NODES 1000000
#define KT_YAML_MAX_MAP_ENTRIES 4096

/* Reads one document from text[0..len).  *root is NULL for an empty stream.
 * Errors are KT_ERR_FORMAT "NAME:LINE:COL: problem" (or KT_ERR_NOMEM). */
kt_status kt_yaml_tree_parse(const char *text, size_t len, const char *name, struct kt_ynode **root, kt_err *err);
void kt_yaml_tree_destroy(struct kt_ynode *root);

/* The value of mapping entry i and its key. */
static inline struct kt_ynode *kt_ymap_key(const struct kt_ynode *map, uint32_t i) { return map->items[2 * i]; }
static inline struct kt_ynode *kt_ymap_value(const struct kt_ynode *map, uint32_t i) { return map->items[2 * i + 1]; }
static inline uint32_t kt_ymap_size(const struct kt_ynode *map) { return map->n / 2; }

/* True when scalar n holds exactly the string s. */
bool kt_yscalar_is(const struct kt_ynode *n, const char *s);

#endif

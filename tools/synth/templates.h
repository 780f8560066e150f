/*
 * templates.h - the real chat templates kt-synth embeds as
 * tokenizer.chat_template, one per model family.
 *
 * A chat template is data the model was trained with: these strings are the
 * models' own Jinja sources and must never be reformatted, "fixed" or
 * shortened.  Renderers and output parsers select their behaviour by
 * detecting markers in them, exactly as they will with real GGUF files.
 */
#ifndef KT_SYNTH_TEMPLATES_H
#define KT_SYNTH_TEMPLATES_H

#include "vocab.h"

/* The family's Jinja chat template (static storage); NULL for an unknown family. */
const char *kt_synth_chat_template(enum kt_synth_family family);

/* The later or reasoning revisions a preset may carry instead of its family's default. */
enum kt_synth_chat_revision {
    KT_SYNTH_CHAT_KIMI_K2_THINKING, /* tests/golden/chat/kimi-k2-thinking.jinja */
    KT_SYNTH_CHAT_DEEPSEEK_R1,      /* tests/golden/chat/deepseek-r1.jinja */
};

/* That revision's Jinja chat template (static storage); NULL for an unknown one. */
const char *kt_synth_chat_template_revision(enum kt_synth_chat_revision revision);


#endif

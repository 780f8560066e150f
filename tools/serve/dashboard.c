/*
 * dashboard.c - GET /dashboard: the live page (dashboard.html, embedded at
 * build time by embed.cmake).  The page only polls /kt/stats and
 * /kt/placement; nothing here reads the server's state.
 */
#include <stddef.h>

#include "server.h"

extern const unsigned char kt_dashboard_html[]; /* dashboard.html's bytes, then a NUL */
extern const size_t kt_dashboard_html_len;

enum MHD_Result kt_serve_dashboard(struct kt_http_request *rq)
{
    return kt_http_send(rq, 200, "text/html; charset=utf-8", (const char *)kt_dashboard_html,
                        kt_dashboard_html_len);
}

/* metrics_cli.h: the metrics in the sluice command (metrics_cli.c):
 * --metrics-port N for verify (and any command that opens one model),
 * `sluice stats PATH`, and `sluice bench-metrics PATH`. */
#ifndef SLUICE_METRICS_CLI_H
#define SLUICE_METRICS_CLI_H

#include <sluice.h>

/* If argv[*i] is --metrics-port N, sets *port (0..65535) and returns 1
 * (-1 with a message on a bad value); 0 for any other argument. */
int mc_port_option(const char *cmd, int argc, char **argv, int *i, int *port);

/* port < 0: returns NULL, nothing served. Else serves m's metrics on
 * 127.0.0.1:port and says where on stderr; *failed is set (message
 * printed) when it cannot. */
sluice_metrics_server *mc_serve(const char *cmd, int port, sluice_model *m, int *failed);

/* Stops serving m and frees the server (NULL: nothing). */
void mc_stop(sluice_metrics_server *s, sluice_model *m);

#define MC_PORT_HELP \
    "  --metrics-port N  serve the model's metrics on http://127.0.0.1:N/metrics\n" \
    "                    while the command runs (0: any free port)\n"

#endif

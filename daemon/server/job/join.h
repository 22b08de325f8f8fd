/* The server's side of jobs across nodes (job.h): the register and init
 * handlers call these. */
#ifndef PE_SERVER_JOB_JOIN_H
#define PE_SERVER_JOB_JOIN_H

#include "core/status.h"
#include "server/registry/registry.h"
#include "service.pb-c.h"

/* rq asks for a job (options.job): p's model joins it, forming it when the
 * model has no job or a broken one (blocks up to [job] timeout); nothing
 * when rq has no job spec. */
pe_status *pe_srv_job_join(pe_server *s, pe_srv_program *p, const Pe__RegisterRequest *rq);

/* A run of p (compiled for a job) needs its model's job formed and
 * healthy: else an error saying to register again. */
pe_status *pe_srv_job_check_formed(pe_srv_program *p);

/* After p's startup ran on a model in a job (caller holds init_mu): every
 * node takes rank 0's initial values. A collective: in a job every node
 * inits (their models all lack values, the rendezvous checked). */
pe_status *pe_srv_job_after_init(pe_srv_program *p);

#endif

/* tm_api.h -- what the public API's types are in the engine's terms, for the tools that drive the engine directly. */
#ifndef TM_API_H
#define TM_API_H

#include "tokenmill.h"

#include "engine/tm_engine.h"

/* The engine's form of a request's parameters (stop points at p->stop). */
tm_gen_params tm_api_gen_params(const tm_generate_params *p);

#endif /* TM_API_H */

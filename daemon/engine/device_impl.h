/* Shared by the device kinds' implementations (device_cpu.c, device_sim.c);
 * not for the executor. */
#ifndef PE_ENGINE_DEVICE_IMPL_H
#define PE_ENGINE_DEVICE_IMPL_H

#include "device.h"

/* Set up / tear down the common part of a device (ops, place, budget,
 * event pool). fini frees the pooled events. */
void pe_device_base_init(pe_device *d, const pe_device_ops *ops, pe_place place, int threads);
void pe_device_base_fini(pe_device *d);

#endif

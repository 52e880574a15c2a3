"""MCL's own parts: clustering between stages, pseudo-labels, batch plans, the sampler and the steps over them."""

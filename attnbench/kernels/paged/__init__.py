"""The paged route: the one-launch Triton kernel over every batch of the paged layout, and the MHA / GQA plan."""

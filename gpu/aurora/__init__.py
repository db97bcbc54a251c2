"""Aurora (Li et al., 2024): MoE inference time from expert placement and all-to-all order.

`a2a`: the contention-free all-to-all schedule (Theorem 4.2: padding + Birkhoff-von Neumann rounds,
makespan = the largest line sum); `fluid`: a fluid network simulator to time any send order;
`matching`: bottleneck bipartite matching; `placement`: exclusive and colocated placement,
homogeneous and heterogeneous (Theorems 5.1, 6.1, 6.2, the two-stage heuristic) with brute-force
oracles; `timeline`: the per-layer inference time (Eq. 1-3, Table 2).
"""

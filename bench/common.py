"""Moved to ``benchmarks.common`` (an installed package, so that ``pidctl bench`` can use it); re-exported here
for the scripts in this folder."""
from benchmarks.common import (DESCRIBE_POLICY, GOLDEN, HOST, LeaderKill, check_inside, describe_all,
                               environment_info, find_leader, fmt_num, kill_leaders, loadavg, log, paced, percentile,
                               print_footer, run_phases, table, temp_cluster, utc_now)

__all__ = ["DESCRIBE_POLICY", "GOLDEN", "HOST", "LeaderKill", "check_inside", "describe_all", "environment_info",
           "find_leader", "fmt_num", "kill_leaders", "loadavg", "log", "paced", "percentile", "print_footer", "run_phases",
           "table", "temp_cluster", "utc_now"]

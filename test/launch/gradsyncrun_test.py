"""gradsyncrun's argument handling, host lists and the commands it builds (no job is started)."""
import importlib.machinery
import io
import importlib.util
import os
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "launch", "gradsyncrun")
loader = importlib.machinery.SourceFileLoader("gradsyncrun", SCRIPT)
spec = importlib.util.spec_from_loader("gradsyncrun", loader)
run = importlib.util.module_from_spec(spec)
loader.exec_module(run)


def command(argv, environ=None, pmix=False):
    environ = {} if environ is None else environ
    return run.build_command(run.parse(argv, environ), environ, pmix)[0]


class HostsTest(unittest.TestCase):
    def test_host_list(self):
        self.assertEqual(run.parse_hosts("a:2,b,c:4"), [("a", 2), ("b", 1), ("c", 4)])
        for bad in ("a:0", "a:-1", "a:x", ""):
            with self.assertRaises(run.UsageError):
                run.parse_hosts(bad)

    def test_hostfile_in_both_formats(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("# a comment\nnode1 slots=2\nnode2:3  # horovodrun style\n\nnode3\n")
        try:
            self.assertEqual(run.parse_hostfile(f.name), [("node1", 2), ("node2", 3), ("node3", 1)])
        finally:
            os.unlink(f.name)

    def test_unreadable_or_bad_hostfile(self):
        with self.assertRaisesRegex(run.UsageError, "No such file"):
            run.parse_hostfile("/nonexistent/hosts")
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("node1 colour=blue\n")
        try:
            with self.assertRaisesRegex(run.UsageError, "unknown field"):
                run.parse_hostfile(f.name)
        finally:
            os.unlink(f.name)

    def test_slurm_nodelist(self):
        self.assertEqual(run.expand_nodelist("n[01-03,07],login"),
                         ["n01", "n02", "n03", "n07", "login"])
        self.assertEqual(run.expand_tasks_per_node("2(x3),1", 4), [2, 2, 2, 1])
        self.assertEqual(run.expand_tasks_per_node("", 2), [1, 1])

    def test_task_counts_for_other_nodes_are_refused(self):
        # In `srun -N1 -n1 --pty bash` inside a 2-node job, Slurm sets the step's counts.
        step = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1",
                "SLURM_NTASKS": "1"}
        for argv in (["./t"], ["-np", "2", "./t"], ["--min-np", "2", "./t"]):
            argv = ["--dry-run"] + argv  # nothing may start where the check is missing
            with redirect_stderr(io.StringIO()) as err, redirect_stdout(io.StringIO()):
                self.assertEqual(run.main(argv, step), 2, argv)
            self.assertIn("SLURM_TASKS_PER_NODE=1 counts tasks on 1 node(s), but "
                          "SLURM_JOB_NODELIST has 2 nodes", err.getvalue())
            self.assertIn("-np N and -H", err.getvalue())
        # Hosts given explicitly do not consult the allocation.
        self.assertIn("a:1,b:1", command(["-np", "2", "-H", "a,b", "./t"], step))


class CommandTest(unittest.TestCase):
    def test_settings_become_forwarded_variables(self):
        argv = ["-np", "4", "--fusion-threshold-mb", "32", "--hierarchical-allreduce", "./t"]
        cmd = command(argv, {"NCCL_DEBUG": "INFO", "HOME": "/root"})
        self.assertEqual(cmd[:3], ["mpirun", "-np", "4"])
        for name in ("GRADSYNC_FUSION_THRESHOLD", "GRADSYNC_HIERARCHICAL_ALLREDUCE", "NCCL_DEBUG"):
            self.assertIn(name, cmd[cmd.index("-x", cmd.index(name) - 1) + 1:])
        self.assertNotIn("HOME", cmd)
        self.assertEqual(cmd[-1], "./t")

    def test_what_a_remote_rank_needs_and_what_x_names_is_forwarded(self):
        env = {"PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/build/python", "HOME": "/root",
               "DATA": "/data"}
        cmd = command(["-np", "2", "-H", "a,b", "-x", "DATA", "-x", "SEED=7", "./t"], env)
        forwarded = [cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"]
        self.assertEqual(forwarded, ["DATA", "PATH", "PYTHONPATH", "SEED"])
        with self.assertRaisesRegex(run.UsageError, "-x MISSING: not set here"):
            command(["-np", "2", "-x", "MISSING", "./t"], env)
        with self.assertRaisesRegex(run.UsageError, "NAME or NAME=VALUE"):
            command(["-np", "2", "-x", "=7", "./t"], env)

    def test_a_dry_run_shows_what_the_launch_sets_too(self):
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "4",
               "SLURM_TASKS_PER_NODE": "4", "SLURM_OVERCOMMIT": "1"}
        with redirect_stdout(io.StringIO()) as out:
            self.assertEqual(run.main(["--launcher", "mpirun", "--dry-run", "./t"], env), 0)
        self.assertTrue(out.getvalue().startswith("OMPI_MCA_mpi_yield_when_idle=1 mpirun "),
                        out.getvalue())

    def test_long_flags_take_their_value_after_an_equals_sign(self):
        self.assertEqual(command(["--np=3", "--hosts=a:2,b", "./t"])[:3], ["mpirun", "-np", "3"])
        self.assertEqual(command(["--num-proc", "2", "./t"])[:3], ["mpirun", "-np", "2"])
        with self.assertRaisesRegex(run.UsageError, "--oversubscribe takes no value"):
            command(["-np", "2", "--oversubscribe=1", "./t"])
        with tempfile.NamedTemporaryFile("w", suffix=".hosts") as f:
            f.write("node1 slots = 4\nnode2 slots=2\n")
            f.flush()
            self.assertIn("node1:4,node2:2", command(["-np", "6", "--hostfile=" + f.name, "./t"]))

    def test_srun_refuses_hosts_and_overcommits_when_oversubscribed(self):
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "2",
               "SLURM_TASKS_PER_NODE": "2"}
        with self.assertRaisesRegex(run.UsageError, "-H and --hostfile are for mpirun"):
            command(["--launcher", "srun", "-np", "2", "-H", "a,b", "./t"], env)
        cmd = command(["--launcher", "srun", "-np", "4", "--oversubscribe", "./t"], env)
        self.assertEqual(cmd[:5], ["srun", "--mpi=pmix", "--ntasks=4", "--export=ALL",
                                   "--overcommit"])

    def test_srun_is_chosen_only_where_both_sides_have_pmix(self):
        # Every Open MPI 4 lists its 'isolated' and 'flux' components; only a client counts.
        self.assertFalse(run.ompi_info_lists_pmix(
            "  MCA pmix: isolated (MCA v2.1.0)\n  MCA pmix: flux (MCA v2.1.0)\n"))
        self.assertTrue(run.ompi_info_lists_pmix("  MCA pmix: ext3x (MCA v2.1.0)\n"))
        self.assertTrue(run.ompi_info_lists_pmix("  MCA pmix: pmix3x (MCA v2.1.0)\n"))
        listing = "MPI plugin types are...\n\tnone\n\tpmi2\n\tpmix\nspecific pmix plugin " \
                  "versions available: pmix_v3\n"
        self.assertTrue(run.srun_lists_pmix(listing))
        self.assertFalse(run.srun_lists_pmix("MPI plugin types are...\n\tnone\n\tpmi2\n"))
        self.assertFalse(run.pmix_launch_works({}))  # outside an allocation srun is not asked

    def test_placement_flags(self):
        import contextlib
        import io
        out = io.StringIO()
        argv = ["-np", "2", "--gpu-device", "1", "--thread-affinity", "2,3", "--bind-process",
                "--autotune", "--autotune-log-file", "tune.csv", "--no-calibrate",
                "--calibration-seconds", "2.5", "--dry-run", "./t"]
        with contextlib.redirect_stdout(out):
            self.assertEqual(run.main(argv, {}), 0)
        line = out.getvalue()
        for setting in ("GRADSYNC_GPU_DEVICE=1", "GRADSYNC_THREAD_AFFINITY=2,3",
                        "GRADSYNC_BIND_PROCESS=1", "-x GRADSYNC_THREAD_AFFINITY",
                        "GRADSYNC_AUTOTUNE=1", "GRADSYNC_AUTOTUNE_LOG=tune.csv",
                        "GRADSYNC_CALIBRATE=0", "GRADSYNC_CALIBRATION_SECONDS=2.5"):
            self.assertIn(setting, line)

    def test_more_ranks_than_slots_is_refused_unless_oversubscribed(self):
        with self.assertRaisesRegex(run.UsageError, "only 4 slots"):
            command(["-np", "5", "-H", "a:2,b:2", "./t"])
        cmd = command(["-np", "5", "-H", "a:2,b:2", "--oversubscribe", "./t"])
        self.assertIn("--oversubscribe", cmd)
        self.assertIn("a:2,b:2", cmd)

    def test_slurm_allocation_without_hosts(self):
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
               "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2"}
        self.assertEqual(command(["./t"], env, pmix=True)[:4],
                         ["srun", "--mpi=pmix", "--ntasks=4", "--export=ALL"])
        cmd = command(["./t"], env, pmix=False)
        self.assertEqual(cmd[:3], ["mpirun", "-np", "4"])
        self.assertIn("n1:2,n2:2", cmd)

    def test_a_slurm_job_that_asked_for_no_tasks_runs_one_a_node(self):
        # Without --ntasks or --ntasks-per-node, SLURM_TASKS_PER_NODE counts each node's CPUs.
        env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
               "SLURM_TASKS_PER_NODE": "64(x2)", "SLURM_JOB_CPUS_PER_NODE": "64(x2)"}
        self.assertEqual(command(["./t"], env, pmix=True)[:3], ["srun", "--mpi=pmix", "--ntasks=2"])
        cmd = command(["./t"], env, pmix=False)
        self.assertEqual(cmd[:3], ["mpirun", "-np", "2"])
        self.assertIn("n1:1,n2:1", cmd)

    def test_ranks_yield_where_the_allocation_oversubscribes(self):
        def launch_env(extra, pmix, argv=("./t",)):
            env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                   "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NTASKS": "8"}
            env.update(extra)
            return run.build_command(run.parse(list(argv), env), env, pmix)[1]

        # srun (with PMIx) and mpirun on the allocation (without) alike.
        for pmix in (True, False):
            for extra in ({"SLURM_OVERCOMMIT": "1"}, {"SLURM_JOB_CPUS_PER_NODE": "4,2"}):
                env = launch_env(extra, pmix)
                self.assertEqual(env.get("OMPI_MCA_mpi_yield_when_idle"), "1", (pmix, extra))
            for extra in ({}, {"SLURM_JOB_CPUS_PER_NODE": "4(x2)"},
                          {"SLURM_JOB_CPUS_PER_NODE": "8,?"}, {"SLURM_JOB_CPUS_PER_NODE": "2"}):
                env = launch_env(extra, pmix)
                self.assertNotIn("OMPI_MCA_mpi_yield_when_idle", env, (pmix, extra))
            # The user's own setting stands.
            env = launch_env({"SLURM_OVERCOMMIT": "1", "OMPI_MCA_mpi_yield_when_idle": "0"}, pmix)
            self.assertEqual(env["OMPI_MCA_mpi_yield_when_idle"], "0")
        # mpirun on hosts the user gave knows their slots itself.
        env = launch_env({"SLURM_OVERCOMMIT": "1"}, False, ["-np", "2", "-H", "a:2", "./t"])
        self.assertNotIn("OMPI_MCA_mpi_yield_when_idle", env)

    def test_bad_flags(self):
        for argv, message in ((["-np", "2", "--bogus", "./t"], "unknown flag"),
                              (["-np", "2"], "no program"),
                              (["./t"], "-np N is required"),
                              (["-np", "0", "./t"], "positive"),
                              (["-np", "2", "--cycle-time-ms"], "needs a value"),
                              (["-np", "2", "--fusion-threshold-mb", "lots", "./t"],
                               "not a number"),
                              (["-np", "2", "--launcher", "ssh", "./t"], "--launcher")):
            with self.assertRaisesRegex(run.UsageError, message):
                command(argv)

    def test_sizes_in_mb_are_whole_bytes_of_zero_or_more(self):
        for flag, name in (("--fusion-threshold-mb", "GRADSYNC_FUSION_THRESHOLD"),
                           ("--inplace-threshold-mb", "GRADSYNC_INPLACE_THRESHOLD"),
                           ("--shm-threshold-mb", "GRADSYNC_SHM_THRESHOLD")):
            for mb, size in (("0", "0"), ("0.5", "524288"), ("16", "16777216"),
                             ("1e-6", "1")):  # 1.05 bytes, rounded down
                self.assertEqual(run.parse(["-np", "2", flag, mb, "./t"], {})["env"][name], size)
            for bad, why in (("-1", "0 or more"), ("-0.5", "0 or more"), ("inf", "0 or more"),
                             ("-inf", "0 or more"), ("nan", "0 or more"), ("1e400", "0 or more"),
                             ("1e-9", "less than one byte"), ("lots", "not a number")):
                argv = ["-np", "2", flag, bad, "--dry-run", "./t"]
                with redirect_stderr(io.StringIO()) as err, redirect_stdout(io.StringIO()):
                    self.assertEqual(run.main(argv, {}), 2, bad)
                self.assertIn("%s: " % flag, err.getvalue())
                self.assertIn(why, err.getvalue())

    def test_mpi_args_go_before_the_program(self):
        cmd = command(["-np", "2", "--mpi-args", "--mca btl tcp,self --report-bindings", "./t"])
        self.assertEqual(cmd[-5:], ["--mca", "btl", "tcp,self", "--report-bindings", "./t"])
        self.assertEqual(cmd[3:5], ["--bind-to", "none"])
        bound = command(["-np", "2", "--mpi-args", "--bind-to core", "./t"])
        self.assertEqual(bound.count("--bind-to"), 1)
        self.assertEqual(bound[-3:], ["--bind-to", "core", "./t"])
        with self.assertRaisesRegex(run.UsageError, "--mpi-args"):
            command(["-np", "2", "--mpi-args", "'unbalanced", "./t"])

    def test_any_binding_in_mpi_args_replaces_the_default(self):
        # Open MPI takes one dash or two; PE=n and --cpus-per-proc bind to cores, and a
        # --bind-to none beside them leaves the ranks unbound.
        for args in ("--bind-to=core", "-bind-to core", "--bind-to-core", "-bind-to-socket",
                     "--map-by slot:PE=2", "-map-by ppr:2:socket:pe=2", "--map-by=core:PE=2",
                     "--map-by socket:span,PE=2", "--cpus-per-proc 2", "-cpus-per-rank 2"):
            cmd = command(["-np", "2", "--mpi-args", args, "./t"])
            self.assertNotIn("none", cmd, args)
            self.assertEqual(cmd[-1 - len(args.split()):-1], args.split())
        for args in ("--map-by slot", "--map-by ppr:2:socket --report-bindings",
                     "--mca rmaps_base_mapping_policy core -x PE=2"):
            cmd = command(["-np", "2", "--mpi-args", args, "./t"])
            self.assertEqual(cmd[3:5], ["--bind-to", "none"], args)

    def test_dry_run_quotes_each_argument(self):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(run.main(["-np", "2", "--dry-run", "./t", "a b", "c'd"], {}), 0)
        self.assertIn("./t 'a b' 'c'\"'\"'d'", out.getvalue())


class ElasticFlagsTest(unittest.TestCase):
    def test_elastic_flags_are_read(self):
        opts = run.parse(["--min-np", "2", "--max-np", "4", "--host-discovery-script", "d.sh",
                          "--reset-limit", "3", "--cooldown", "5", "--elastic-timeout", "30",
                          "--checkpoint-dir", "c", "./t"], {})
        self.assertEqual(opts["elastic"], {
            "min_np": 2, "max_np": 4, "script": "d.sh", "reset_limit": 3, "cooldown": 5.0,
            "elastic_timeout": 30.0, "checkpoint_dir": os.path.abspath("c")})

    def test_impossible_elastic_requests_are_refused(self):
        for argv, why in ((["--min-np", "3", "--max-np", "2", "-H", "a:4", "./t"], "more than"),
                          (["--min-np", "2", "./t"], "needs --host-discovery-script"),
                          (["--min-np", "0", "-H", "a", "./t"], "positive whole number")):
            with redirect_stderr(io.StringIO()) as err:
                self.assertEqual(run.main(argv, {}), 2)
            self.assertIn(why, err.getvalue())

    def test_each_world_is_an_mpirun_on_its_hosts(self):
        with redirect_stdout(io.StringIO()) as out:
            self.assertEqual(run.main(["--min-np", "2", "-H", "a:2,b:2", "--max-np", "3",
                                       "--dry-run", "./t"], {}), 0)
        self.assertIn("mpirun -np 3 --bind-to none -H a:2,b:1", out.getvalue())


if __name__ == "__main__":
    unittest.main()

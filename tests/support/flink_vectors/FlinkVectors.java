/*
 * Reference vectors from Flink's own classes (run, not re-implemented).
 *
 * Compiled against the jars of the `apache-flink-libraries` wheel (pyflink/lib/*) and driven by
 * `python -m tests.support.flink_vectors`, which writes the cases to stdin (one request per line) and
 * reads the answers from stdout (one line per request, in order). Strings travel as hex of
 * their UTF-16 code units, so any Java String (lone surrogates included) round-trips.
 *
 * Requests:
 *   KG <string|int|long> <maxParallelism> <parallelism> <key>
 *        -> "<assignToKeyGroup> <assignKeyToParallelOperator>" (KeyGroupRangeAssignment)
 *   RANGE <maxParallelism> <parallelism> <index>  -> computeKeyGroupRangeForOperatorIndex: "start end"
 *   DEFMAX <parallelism>                          -> computeDefaultMaxParallelism
 *   HM <put|cia> <initialCapacity|-1> <hex>...    -> java.util.HashMap iteration order of the names,
 *        filled with put() (initial capacity, -1 = default constructor) or computeIfAbsent()
 *   OP <p0> <p1> <subtask>;<subtask>;...
 *   CHAIN <p0> <p1> <p2> <subtask>;<subtask>;...
 *        Flink's own operator state backend through one (OP) or two (CHAIN) rescales. Old subtask
 *        s is "-" (nothing registered) or comma-separated "<hex name>:<S|U|B>:<element count>"
 *        (split, union, broadcast) in the order its operator registers them: a
 *        DefaultOperatorStateBackend registers those states and adds elements "s<s>e<i>" (a
 *        broadcast state gets one entry). Its snapshot is repartitioned by
 *        RoundRobinOperatorStateRepartitioner to p1 subtasks, each restored from its handles and
 *        then registering every state of the operator in name order (as operator code does in
 *        initializeState); for CHAIN, their snapshots are repartitioned to p2 subtasks and
 *        restored. A subtask's handles are restored in old-subtask order (Flink leaves that order
 *        to a HashMap of stream handles, whose names are random). Answer, per rescale (" "-
 *        separated): per subtask (";"-separated) its non-empty list states in name order (","
 *        separated), each "<hex name>:<S|U>:<elements, '.'-separated>".
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.api.common.ExecutionConfig;
import org.apache.flink.api.common.state.BroadcastState;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.typeutils.base.StringSerializer;
import org.apache.flink.core.fs.CloseableRegistry;
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.checkpoint.RoundRobinOperatorStateRepartitioner;
import org.apache.flink.runtime.state.DefaultOperatorStateBackend;
import org.apache.flink.runtime.state.DefaultOperatorStateBackendBuilder;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.runtime.state.OperatorStateHandle;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.memory.MemCheckpointStreamFactory;
import org.apache.flink.util.concurrent.FutureUtils;

public final class FlinkVectors {

    static String unhex(String hex) {
        StringBuilder out = new StringBuilder(hex.length() / 4);
        for (int i = 0; i < hex.length(); i += 4) {
            out.append((char) Integer.parseInt(hex.substring(i, i + 4), 16));
        }
        return out.toString();
    }

    static String hex(String s) {
        StringBuilder out = new StringBuilder(s.length() * 4);
        for (int i = 0; i < s.length(); i++) {
            out.append(String.format("%04x", (int) s.charAt(i)));
        }
        return out.toString();
    }

    static String keyGroup(String[] f) {
        int maxParallelism = Integer.parseInt(f[2]);
        int parallelism = Integer.parseInt(f[3]);
        Object key;
        switch (f[1]) {
            case "string":
                key = unhex(f[4]);
                break;
            case "int":
                key = Integer.valueOf(f[4]);
                break;
            case "long":
                key = Long.valueOf(f[4]);
                break;
            default:
                throw new IllegalArgumentException("key type " + f[1]);
        }
        return KeyGroupRangeAssignment.assignToKeyGroup(key, maxParallelism)
                + " "
                + KeyGroupRangeAssignment.assignKeyToParallelOperator(key, maxParallelism, parallelism);
    }

    static String hashMapOrder(String[] f) {
        int capacity = Integer.parseInt(f[2]);
        Map<String, Integer> map = capacity < 0 ? new HashMap<>() : new HashMap<>(capacity);
        for (int i = 3; i < f.length; i++) {
            String name = unhex(f[i]);
            if (f[1].equals("put")) {
                map.put(name, i);
            } else {
                map.computeIfAbsent(name, k -> 0);
            }
        }
        List<String> names = new ArrayList<>();
        for (String name : map.keySet()) {
            names.add(hex(name));
        }
        return String.join(" ", names);
    }

    /** One operator's states: name -> mode letter, in name order (operator code registers them so). */
    static final class Operator {
        final TreeMap<String, String> modes = new TreeMap<>();
    }

    static DefaultOperatorStateBackend backend(List<OperatorStateHandle> restore) throws Exception {
        return new DefaultOperatorStateBackendBuilder(
                        FlinkVectors.class.getClassLoader(),
                        new ExecutionConfig(),
                        false,
                        restore,
                        new CloseableRegistry())
                .build();
    }

    static ListStateDescriptor<String> listDescriptor(String name) {
        return new ListStateDescriptor<>(name, StringSerializer.INSTANCE);
    }

    static Object register(DefaultOperatorStateBackend backend, String name, String mode) throws Exception {
        switch (mode) {
            case "S":
                return backend.getListState(listDescriptor(name));
            case "U":
                return backend.getUnionListState(listDescriptor(name));
            default:
                return backend.getBroadcastState(
                        new MapStateDescriptor<>(name, StringSerializer.INSTANCE, StringSerializer.INSTANCE));
        }
    }

    /** The backend's snapshot: its one handle, or none when it holds no state. */
    static List<OperatorStateHandle> snapshot(DefaultOperatorStateBackend backend) throws Exception {
        SnapshotResult<OperatorStateHandle> result = FutureUtils.runIfNotDoneAndGet(backend.snapshot(
                1L, 1L, new MemCheckpointStreamFactory(Integer.MAX_VALUE),
                CheckpointOptions.forCheckpointWithDefaultLocation()));
        OperatorStateHandle handle = result == null ? null : result.getJobManagerOwnedSnapshot();
        List<OperatorStateHandle> handles = new ArrayList<>();
        if (handle != null) {
            handles.add(handle);
        }
        return handles;
    }

    /** Repartition, then restore each new subtask from its handles in old-subtask order and
     * register every state of the operator in name order. */
    static List<DefaultOperatorStateBackend> rescale(
            Operator operator, List<DefaultOperatorStateBackend> old, int newParallelism) throws Exception {
        List<List<OperatorStateHandle>> handles = new ArrayList<>();
        Map<StreamStateHandle, Integer> subtaskOf = new IdentityHashMap<>();
        for (int s = 0; s < old.size(); s++) {
            List<OperatorStateHandle> own = snapshot(old.get(s));
            for (OperatorStateHandle handle : own) {
                subtaskOf.put(handle.getDelegateStateHandle(), s);
            }
            handles.add(own);
        }
        List<List<OperatorStateHandle>> result =
                RoundRobinOperatorStateRepartitioner.INSTANCE.repartitionState(handles, old.size(), newParallelism);
        List<DefaultOperatorStateBackend> restored = new ArrayList<>();
        for (List<OperatorStateHandle> mine : result) {
            List<OperatorStateHandle> ordered = new ArrayList<>(mine);
            ordered.sort((a, b) -> Integer.compare(
                    subtaskOf.get(a.getDelegateStateHandle()), subtaskOf.get(b.getDelegateStateHandle())));
            DefaultOperatorStateBackend backend = backend(ordered);
            for (Map.Entry<String, String> e : operator.modes.entrySet()) {
                register(backend, e.getKey(), e.getValue());
            }
            restored.add(backend);
        }
        return restored;
    }

    @SuppressWarnings("unchecked")
    static String lists(Operator operator, List<DefaultOperatorStateBackend> subtasks) throws Exception {
        List<String> out = new ArrayList<>();
        for (DefaultOperatorStateBackend backend : subtasks) {
            List<String> entries = new ArrayList<>();
            for (Map.Entry<String, String> e : operator.modes.entrySet()) {
                if (e.getValue().equals("B")) {
                    continue;
                }
                List<String> elements = new ArrayList<>();
                for (String element : ((ListState<String>) register(backend, e.getKey(), e.getValue())).get()) {
                    elements.add(element);
                }
                if (!elements.isEmpty()) {
                    entries.add(hex(e.getKey()) + ":" + e.getValue() + ":" + String.join(".", elements));
                }
            }
            out.add(String.join(",", entries));
        }
        return String.join(";", out);
    }

    /** OP (one rescale) or CHAIN (two): the subtasks' lists after each. */
    @SuppressWarnings("unchecked")
    static String rescales(String[] f, int rescales) throws Exception {
        int p0 = Integer.parseInt(f[1]);
        String spec = f.length > 2 + rescales ? f[2 + rescales] : "";
        String[] subtasks = spec.split(";", -1);
        if (subtasks.length != p0) {
            throw new IllegalArgumentException("expected " + p0 + " subtasks, got " + subtasks.length);
        }
        Operator operator = new Operator();
        List<DefaultOperatorStateBackend> backends = new ArrayList<>();
        for (int s = 0; s < p0; s++) {
            DefaultOperatorStateBackend backend = backend(Collections.emptyList());
            if (!subtasks[s].equals("-") && !subtasks[s].isEmpty()) {
                for (String entry : subtasks[s].split(",")) {
                    String[] p = entry.split(":");
                    String name = unhex(p[0]);
                    operator.modes.put(name, p[1]);
                    Object state = register(backend, name, p[1]);
                    if (p[1].equals("B")) {
                        ((BroadcastState<String, String>) state).put("k", "s" + s);
                        continue;
                    }
                    for (int e = 0; e < Integer.parseInt(p[2]); e++) {
                        ((ListState<String>) state).add("s" + s + "e" + e);
                    }
                }
            }
            backends.add(backend);
        }
        List<String> answers = new ArrayList<>();
        for (int level = 0; level < rescales; level++) {
            backends = rescale(operator, backends, Integer.parseInt(f[2 + level]));
            answers.add(lists(operator, backends));
        }
        return String.join(" ", answers);
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintWriter out = new PrintWriter(System.out, false, StandardCharsets.UTF_8);
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) {
                continue;
            }
            String[] f = line.split(" ", -1);
            switch (f[0]) {
                case "KG":
                    out.println(keyGroup(f));
                    break;
                case "RANGE": {
                    KeyGroupRange range = KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex(
                            Integer.parseInt(f[1]), Integer.parseInt(f[2]), Integer.parseInt(f[3]));
                    out.println(range.getStartKeyGroup() + " " + range.getEndKeyGroup());
                    break;
                }
                case "DEFMAX":
                    out.println(KeyGroupRangeAssignment.computeDefaultMaxParallelism(Integer.parseInt(f[1])));
                    break;
                case "HM":
                    out.println(hashMapOrder(f));
                    break;
                case "OP":
                    out.println(rescales(f, 1));
                    break;
                case "CHAIN":
                    out.println(rescales(f, 2));
                    break;
                default:
                    throw new IllegalArgumentException("unknown request " + f[0]);
            }
        }
        out.flush();
    }
}

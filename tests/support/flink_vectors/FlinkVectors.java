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
 *   OP <oldParallelism> <newParallelism> <subtask>;<subtask>;...
 *        one OperatorStreamStateHandle per old subtask: "-" = the subtask has no handle, else
 *        comma-separated "<hex name>:<S|U|B>:<element count>" (split, union, broadcast: a broadcast
 *        state is one entry) put, in that order, into
 *        CollectionUtil.newHashMapWithExpectedSize(n) (as DefaultOperatorStateBackendSnapshotStrategy
 *        builds a handle's map); element e of a name is one byte at its own offset in the
 *        subtask's ByteStreamStateHandle. Answer: RoundRobinOperatorStateRepartitioner.INSTANCE
 *        .repartitionState(...), per new subtask (";"-separated) its handles in result order
 *        ("|"-separated), each "<old subtask>=<hex name>:<S|U|B>:<element indexes, '.'-separated>"
 *        entries ("," separated) in the handle's map order.
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.runtime.checkpoint.RoundRobinOperatorStateRepartitioner;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.runtime.state.OperatorStateHandle;
import org.apache.flink.runtime.state.OperatorStreamStateHandle;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.memory.ByteStreamStateHandle;
import org.apache.flink.util.CollectionUtil;

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

    static OperatorStateHandle.Mode mode(String letter) {
        switch (letter) {
            case "S":
                return OperatorStateHandle.Mode.SPLIT_DISTRIBUTE;
            case "U":
                return OperatorStateHandle.Mode.UNION;
            case "B":
                return OperatorStateHandle.Mode.BROADCAST;
            default:
                throw new IllegalArgumentException("mode " + letter);
        }
    }

    static String letter(OperatorStateHandle.Mode mode) {
        switch (mode) {
            case SPLIT_DISTRIBUTE:
                return "S";
            case UNION:
                return "U";
            default:
                return "B";
        }
    }

    static String repartition(String[] f) {
        int oldParallelism = Integer.parseInt(f[1]);
        int newParallelism = Integer.parseInt(f[2]);
        String[] subtasks = f.length > 3 ? f[3].split(";", -1) : new String[0];
        if (subtasks.length != oldParallelism) {
            throw new IllegalArgumentException("expected " + oldParallelism + " subtasks, got " + subtasks.length);
        }
        List<List<OperatorStateHandle>> old = new ArrayList<>(oldParallelism);
        // offset -> element index, per old subtask (offsets are unique within one subtask's stream)
        Map<StreamStateHandle, Integer> subtaskOf = new HashMap<>();
        List<Map<Long, Integer>> elementAt = new ArrayList<>();
        for (int s = 0; s < oldParallelism; s++) {
            Map<Long, Integer> positions = new HashMap<>();
            elementAt.add(positions);
            if (subtasks[s].equals("-")) {
                old.add(new ArrayList<>());
                continue;
            }
            String[] entries = subtasks[s].isEmpty() ? new String[0] : subtasks[s].split(",");
            Map<String, OperatorStateHandle.StateMetaInfo> offsets =
                    CollectionUtil.newHashMapWithExpectedSize(entries.length);
            long position = 0;
            for (String entry : entries) {
                String[] p = entry.split(":");
                int count = Integer.parseInt(p[2]);
                long[] at = new long[count];
                for (int e = 0; e < count; e++) {
                    at[e] = position;
                    positions.put(position, e);
                    position++;
                }
                OperatorStateHandle.Mode mode = mode(p[1]);
                offsets.put(unhex(p[0]), new OperatorStateHandle.StateMetaInfo(at, mode));
            }
            ByteStreamStateHandle stream = new ByteStreamStateHandle("subtask-" + s, new byte[(int) position]);
            subtaskOf.put(stream, s);
            List<OperatorStateHandle> handles = new ArrayList<>();
            handles.add(new OperatorStreamStateHandle(offsets, stream));
            old.add(handles);
        }
        List<List<OperatorStateHandle>> result =
                RoundRobinOperatorStateRepartitioner.INSTANCE.repartitionState(old, oldParallelism, newParallelism);
        if (result.size() != newParallelism) {
            throw new IllegalStateException("result has " + result.size() + " subtasks");
        }
        List<String> out = new ArrayList<>();
        for (List<OperatorStateHandle> handles : result) {
            List<String> handleTexts = new ArrayList<>();
            for (OperatorStateHandle handle : handles) {
                int s = subtaskOf.get(handle.getDelegateStateHandle());
                List<String> entryTexts = new ArrayList<>();
                for (Map.Entry<String, OperatorStateHandle.StateMetaInfo> e :
                        handle.getStateNameToPartitionOffsets().entrySet()) {
                    List<String> indexes = new ArrayList<>();
                    for (long offset : e.getValue().getOffsets()) {
                        indexes.add(Integer.toString(elementAt.get(s).get(offset)));
                    }
                    String mode = letter(e.getValue().getDistributionMode());
                    entryTexts.add(hex(e.getKey()) + ":" + mode + ":" + String.join(".", indexes));
                }
                handleTexts.add(s + "=" + String.join(",", entryTexts));
            }
            out.add(String.join("|", handleTexts));
        }
        return String.join(";", out);
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
                    out.println(repartition(f));
                    break;
                default:
                    throw new IllegalArgumentException("unknown request " + f[0]);
            }
        }
        out.flush();
    }
}

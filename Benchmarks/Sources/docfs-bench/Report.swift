// The summary: samples (one line per measurement: figure, side, round, value) become a table of
// medians with min–max, the DocFS ÷ native ratio and whether each target of issue 7 is met,
// and a JSON file with every sample.

import Foundation

/// What a figure must reach (issue 7, "Targets").
enum Target {
    case none
    /// DocFS ÷ native at most this (times: lower is better).
    case ratioAtMost(Double)
    /// DocFS ÷ native at least this (rates: higher is better).
    case ratioAtLeast(Double)
    /// The DocFS median at most this, in the figure's unit.
    case atMost(Double)
    /// The DocFS median at least this, in the figure's unit.
    case atLeast(Double)
    /// The DocFS value must be 0 in every round.
    case zero
    /// DocFS ÷ the FUSE passthrough peer at least this (rates: higher is better; issue 16).
    case peerRatioAtLeast(Double)
    /// DocFS ÷ the FUSE passthrough peer at most this (times: lower is better; issue 16).
    case peerRatioAtMost(Double)
    /// Every one of these (a figure with a target against native and one against the peer).
    indirect case all([Target])

    func text(unit: String) -> String {
        switch self {
        case .none: return "—"
        case .ratioAtMost(let x): return "≤ \(trimmed(x))× native"
        case .ratioAtLeast(let x): return "≥ \(trimmed(x))× native"
        case .atMost(let x): return "≤ \(Report.text(x, unit)) \(unit)"
        case .atLeast(let x): return "≥ \(Report.text(x, unit)) \(unit)"
        case .zero: return "0"
        case .peerRatioAtLeast(let x): return "≥ \(trimmed(x))× peer"
        case .peerRatioAtMost(let x): return "≤ \(trimmed(x))× peer"
        case .all(let targets): return targets.map { $0.text(unit: unit) }.joined(separator: " and ")
        }
    }

    /// Whether the figure's medians meet it; nil when it has none, or a median it needs is missing.
    func isMet(docfs: Summary?, ratio: Double?, peerRatio: Double?) -> Bool? {
        switch self {
        case .none: return nil
        case .ratioAtMost(let x): return ratio.map { $0 <= x }
        case .ratioAtLeast(let x): return ratio.map { $0 >= x }
        case .atMost(let x): return docfs.map { $0.median <= x }
        case .atLeast(let x): return docfs.map { $0.median >= x }
        case .zero: return docfs.map { $0.max == 0 }
        case .peerRatioAtLeast(let x): return peerRatio.map { $0 >= x }
        case .peerRatioAtMost(let x): return peerRatio.map { $0 <= x }
        case .all(let targets):
            // A target without its median (no peer in the run) is left out, not failed.
            let results = targets.compactMap { $0.isMet(docfs: docfs, ratio: ratio, peerRatio: peerRatio) }
            return results.isEmpty ? nil : !results.contains(false)
        }
    }
}

func trimmed(_ x: Double) -> String {
    x == x.rounded() && abs(x) < 1e15 ? String(Int(x)) : String(format: "%g", x)
}

struct Figure {
    var id: String
    var label: String
    var unit: String
    var target: Target
}

/// The sizes of a run (a quick run uses smaller ones), for the labels.
struct Sizes {
    var big = "1 GiB"
    var random = "256 MiB"
    var files = "10,000"
    var documents = "1,000"
    var images = "100"
    /// B9's text wrapper and B10's fsx operations.
    var save = "64 MiB"
    var fsxOperations = "20,000"
    /// B14's file, per writer.
    var twoWriters = "32 MiB"
    /// What "bytes written to the store" counts, and what the daemon reads, for the store kind.
    var storeWrites = "DB + WAL"
    var storeReads = "SQLite records"
    /// What B10 measures as the store's size on disk.
    var storeSize = "file + -wal + -shm"
    /// B15's transactions (and increments) per process.
    var transactions = "1,000"

    init(environment: [String: String]) {
        if environment["BENCH_STORE"] == "postgres" {
            storeWrites =
                environment["BENCH_WAL_SPLIT"] == "1"
                ? "PostgreSQL WAL records; full-page images in the next row" : "PostgreSQL WAL"
            storeReads = "rows from PostgreSQL"
            storeSize = "pg_database_size"
        }
        func mib(_ key: String) -> String? {
            guard let bytes = environment[key].flatMap(Double.init) else { return nil }
            return bytes >= Double(1 << 30)
                ? "\(trimmed(bytes / Double(1 << 30))) GiB" : "\(trimmed(bytes / Double(1 << 20))) MiB"
        }
        func count(_ key: String) -> String? {
            environment[key].flatMap(Int.init).map { Report.text(Double($0), "files/s") }
        }
        big = mib("BENCH_BIG_BYTES") ?? big
        random = mib("BENCH_RAND_BYTES") ?? random
        files = count("BENCH_FILES") ?? files
        documents = count("BENCH_DOCUMENTS") ?? documents
        images = count("BENCH_IMAGES") ?? images
        save = mib("BENCH_SAVE_BYTES") ?? save
        fsxOperations = count("BENCH_FSX_OPS") ?? fsxOperations
        twoWriters = mib("BENCH_TWO_BYTES") ?? twoWriters
        transactions =
            environment["BENCH_TRANSACTIONS"].flatMap(Int.init).map { Report.text(Double($0), "files/s") }
            ?? transactions
    }
}

/// Every figure, in the order of the table. Byte targets use the store's chunk size.
func figureCatalog(chunkSize: Double, sizes: Sizes) -> [Figure] {
    let oneChunkAndMetadata = chunkSize + 192 * 1024
    let chunkTarget = Target.atMost(oneChunkAndMetadata)
    let big = sizes.big
    let files = sizes.files
    let documents = sizes.documents
    return [
        Figure(
            id: "b1.ls.pkg.cold", label: "B1 `ls -l` package of \(files) wrappers, cold", unit: "ms",
            target: .ratioAtMost(1.5)),
        Figure(
            id: "b1.ls.pkg.warm", label: "B1 `ls -l` package of \(files) wrappers, warm", unit: "ms",
            target: .all([.ratioAtMost(1.5), .peerRatioAtMost(1)])),
        Figure(
            id: "b1.ls.root.cold", label: "B1 `ls -l` root of \(documents) documents, cold", unit: "ms",
            target: .ratioAtMost(1.5)),
        Figure(
            id: "b1.ls.root.warm", label: "B1 `ls -l` root of \(documents) documents, warm", unit: "ms",
            target: .all([.ratioAtMost(1.5), .peerRatioAtMost(1)])),
        Figure(
            id: "b1.bytes", label: "B1 wrapper content bytes the store read while listing", unit: "bytes",
            target: .zero),
        Figure(
            id: "b1.daemon.rchar",
            label: "B1 (info) bytes the daemon read (\(sizes.storeReads)), cold package listing",
            unit: "bytes",
            target: .none),
        Figure(
            id: "b2.append.bytes",
            label: "B2 append a line beside \(big): bytes written to the store (\(sizes.storeWrites))",
            unit: "bytes",
            target: chunkTarget),
        Figure(
            id: "b2.append.fpi",
            label:
                "B2 (info) append: full-page images in the WAL (first change of a page after a checkpoint)",
            unit: "bytes", target: .none),
        Figure(
            id: "b2.append.content", label: "B2 (info) append: content bytes the store wrote", unit: "bytes",
            target: .none),
        Figure(
            id: "b2.append.ms", label: "B2 append a line beside \(big) + fsync", unit: "ms",
            target: .atMost(50)),
        Figure(
            id: "b2.image.bytes",
            label:
                "B2 replace one 1 MB image of \(sizes.images): bytes written to the store (\(sizes.storeWrites))",
            unit: "bytes", target: .atMost(1.1 * 1_048_576)),
        Figure(
            id: "b2.image.fpi",
            label: "B2 (info) image: full-page images in the WAL (first change of a page after a checkpoint)",
            unit: "bytes", target: .none),
        Figure(
            id: "b2.image.content", label: "B2 (info) image: content bytes the store wrote", unit: "bytes",
            target: .none),
        Figure(
            id: "b2.image.ms", label: "B2 replace one 1 MB image of \(sizes.images) + fsync", unit: "ms",
            target: .atMost(50)),
        Figure(
            id: "b2.vim.bytes",
            label:
                "B2 vim appends a line to a 1 MB file and saves: bytes written to the store (\(sizes.storeWrites))",
            unit: "bytes", target: chunkTarget),
        Figure(
            id: "b2.vim.fpi",
            label: "B2 (info) vim: full-page images in the WAL (first change of a page after a checkpoint)",
            unit: "bytes", target: .none),
        Figure(
            id: "b2.vim.content", label: "B2 (info) vim: content bytes the store wrote", unit: "bytes",
            target: .none),
        Figure(
            id: "b2.vim.ms", label: "B2 vim appends a line to a 1 MB file and saves (whole vim run)",
            unit: "ms", target: .atMost(50)),
        Figure(
            id: "b3.read.cold", label: "B3 sequential read of a \(big) wrapper, cold", unit: "MiB/s",
            target: .ratioAtLeast(0.8)),
        Figure(
            id: "b3.read.warm", label: "B3 sequential read of a \(big) wrapper, warm", unit: "MiB/s",
            target: .none),
        Figure(
            id: "b3.write", label: "B3 sequential write of a \(big) wrapper + fsync", unit: "MiB/s",
            target: .ratioAtLeast(0.8)),
        Figure(
            id: "b4.randread", label: "B4 4 KiB random read, \(sizes.random) wrapper, cold", unit: "IOPS",
            target: .peerRatioAtLeast(1)),
        Figure(
            id: "b4.randwrite", label: "B4 4 KiB random write, \(sizes.random) wrapper, + fsync",
            unit: "IOPS", target: .peerRatioAtLeast(1)),
        Figure(
            id: "b5.create", label: "B5 create+write+close \(files) files of 4 KiB in a package",
            unit: "files/s", target: .peerRatioAtLeast(1)),
        Figure(id: "b5.stat", label: "B5 stat them", unit: "files/s", target: .peerRatioAtLeast(1)),
        Figure(id: "b5.delete", label: "B5 delete them", unit: "files/s", target: .peerRatioAtLeast(1)),
        Figure(
            id: "b5.create.peerlike",
            label:
                "B5 (info) create+write+close, the peer column: passthrough_ll with DocFS's kernel options (default_permissions, writeback cache)",
            unit: "files/s", target: .none),
        Figure(
            id: "b5.delete.peerlike",
            label: "B5 (info) delete them, the peer column: that passthrough_ll with DocFS's kernel options",
            unit: "files/s", target: .none),
        Figure(
            id: "b12.safesave",
            label:
                "B12 safe-save (temporary file, 4 KiB, fsync, rename over a file, fsync of the folder) in a package of \(files) files",
            unit: "ms", target: .peerRatioAtMost(2)),
        Figure(
            id: "b12.recreate",
            label: "B12 unlink + create the same name + write 4 KiB + fsync, in that package", unit: "ms",
            target: .peerRatioAtMost(2)),
        Figure(
            id: "b13.fsx",
            label:
                "B13 fsx, 20,000 random operations on one file in a package (\(ProcessInfo.processInfo.environment["BENCH_FSX"] == nil ? "scripts/reliability/fsx.py" : "xfstests' ltp/fsx"))",
            unit: "s", target: .peerRatioAtMost(1.5)),
        Figure(
            id: "b14.alone",
            label:
                "B14 one writer replacing its own document's \(sizes.twoWriters) file (O_TRUNC, write, fsync) 6 times",
            unit: "s", target: .none),
        Figure(
            id: "b14.together",
            label: "B14 two writers at once, each in its own document (the same work each)", unit: "s",
            target: .none),
        Figure(
            id: "b14.speedup",
            label:
                "B14 two writers: the work of two done together, as a multiple of one alone's speed (2 × alone ÷ together)",
            unit: "×", target: .atLeast(1.7)),
        Figure(
            id: "b15.lock", label: "B15 uncontended flock + unlock, one mount (native: ext4's)", unit: "ms",
            target: .none),
        Figure(
            id: "b15.across",
            label:
                "B15 uncontended flock + unlock through the second mount, right after one through the first",
            unit: "ms", target: .none),
        Figure(
            id: "b15.handover",
            label:
                "B15 lock handover: from an unlock on one mount to the grant of a flock blocked on the other",
            unit: "ms", target: .atMost(20)),
        Figure(
            id: "b15.sqlite.two",
            label:
                "B15 SQLite, two processes through two mounts, \(sizes.transactions) transactions each (journal_mode=DELETE)",
            unit: "tx/s", target: .none),
        Figure(
            id: "b15.sqlite.one",
            label: "B15 (info) the same two processes through one mount (native: one folder)", unit: "tx/s",
            target: .none),
        Figure(
            id: "b15.sqlite.lost",
            label: "B15 SQLite through two mounts: rows missing at the end (+1 if integrity_check is not ok)",
            unit: "rows", target: .zero),
        Figure(
            id: "b15.counter.lost",
            label:
                "B15 counter file, \(sizes.transactions) increments from each mount under flock: increments missing",
            unit: "increments", target: .zero),
        Figure(
            id: "b15.counter.s", label: "B15 (info) the counter's time", unit: "s", target: .none),
        Figure(
            id: "b6.open.ms",
            label: "B6 `Document.open` + list, package of \(files) wrappers (store vs folder)", unit: "ms",
            target: .atMost(50)),
        Figure(
            id: "b6.open.bytes", label: "B6 content bytes read by the open (store statistics vs rchar)",
            unit: "bytes", target: .zero),
        Figure(
            id: "b6.save.ms", label: "B6 save after changing one wrapper (store vs folder)", unit: "ms",
            target: .atMost(50)),
        Figure(
            id: "b6.save.bytes", label: "B6 (info) content bytes the save wrote (store statistics vs wchar)",
            unit: "bytes", target: .none),
        Figure(
            id: "b7.rss.read", label: "B7 daemon peak RSS streaming (reading) a \(big) wrapper", unit: "MiB",
            target: .atMost(100)),
        Figure(
            id: "b7.rss.write", label: "B7 daemon peak RSS streaming (writing) a \(big) wrapper", unit: "MiB",
            target: .atMost(100)),
        Figure(
            id: "b7.rss.random", label: "B7 daemon peak RSS in B4's random reads and writes", unit: "MiB",
            target: .atMost(100)),
        Figure(
            id: "b7.rss.docs", label: "B7 daemon peak RSS with \(documents) documents open", unit: "MiB",
            target: .atMost(100)),
        Figure(
            id: "b8.save",
            label: "B8 a save through one mount, read through a second mount of the store (from fsync)",
            unit: "ms", target: .atMost(1000)),
        Figure(
            id: "b8.create",
            label: "B8 a document created through one mount, found through a second (from open)",
            unit: "ms", target: .atMost(1000)),
        Figure(
            id: "b9.bytes",
            label: "B9 `sed -i` inserts a first line in a \(sizes.save) text wrapper (whole-file save): "
                + "bytes written to the store (\(sizes.storeWrites))",
            unit: "bytes", target: .atMost(2 * 1_048_576)),
        Figure(
            id: "b9.fpi",
            label: "B9 (info) sed: full-page images in the WAL (first change of a page after a checkpoint)",
            unit: "bytes", target: .none),
        Figure(
            id: "b9.content", label: "B9 (info) sed: content bytes the store wrote", unit: "bytes",
            target: .none),
        Figure(
            id: "b9.ms",
            label: "B9 (info) `sed -i` inserts a first line in a \(sizes.save) text wrapper + fsync",
            unit: "ms", target: .none),
        Figure(
            id: "b10.after.bytes",
            label:
                "B10 store size after fsx (\(sizes.fsxOperations) operations) and `docfs gc --keep-last 1` "
                + "(\(sizes.storeSize))",
            unit: "bytes", target: .atMost(20 * 1_048_576)),
        Figure(
            id: "b10.before.bytes",
            label: "B10 (info) store size after fsx, before the gc (\(sizes.storeSize))",
            unit: "bytes", target: .none),
        Figure(
            id: "b10.fsx.s",
            label: "B10 (info) fsx, \(sizes.fsxOperations) operations in a package through the mount",
            unit: "s", target: .none),
        Figure(
            id: "b10.gc.s", label: "B10 (info) `docfs gc --keep-last 1 --keep-for 0`", unit: "s",
            target: .none),
        Figure(
            id: "b11.ms",
            label: "B11 `cp` of the \(big) wrapper to a new name in the mount, + sync of the copy",
            unit: "ms", target: .atMost(200)),
        Figure(
            id: "b11.bytes",
            label: "B11 the cp: bytes written to the store (\(sizes.storeWrites))",
            unit: "bytes", target: .atMost(1_048_576)),
        Figure(
            id: "b11.fpi",
            label: "B11 (info) cp: full-page images in the WAL (first change of a page after a checkpoint)",
            unit: "bytes", target: .none),
        Figure(
            id: "b11.content", label: "B11 (info) cp: content bytes the store wrote", unit: "bytes",
            target: .none),
        Figure(
            id: "fuse.getattr", label: "FUSE layer: no-op `getattr` (attr timeout 0)", unit: "µs",
            target: .none),
        Figure(id: "fuse.read1m", label: "FUSE layer: 1 MiB direct-I/O read", unit: "µs", target: .none),
    ]
}

struct Summary {
    var median: Double
    var min: Double
    var max: Double
    var samples: [Double]

    init?(_ samples: [Double]) {
        guard !samples.isEmpty else { return nil }
        let sorted = samples.sorted()
        let middle = sorted.count / 2
        median = sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
        min = sorted[0]
        max = sorted[sorted.count - 1]
        self.samples = samples
    }

    var json: [String: Any] { ["median": median, "min": min, "max": max, "samples": samples] }
}

struct Report {
    /// figure → side → values
    var samples: [String: [String: [Double]]] = [:]
    /// Summaries measured elsewhere (FUSEBench reports median, min and max itself).
    var given: [String: [String: Summary]] = [:]

    init(samplesPath: String) throws {
        let text = try String(contentsOfFile: samplesPath, encoding: .utf8)
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let fields = line.split(separator: "\t").map(String.init)
            guard fields.count == 4 else { continue }
            if fields[2] == "stats" {
                let numbers = fields[3].split(separator: ",").compactMap { Double($0) }
                if numbers.count == 3, var summary = Summary([numbers[0]]) {
                    summary.min = numbers[1]
                    summary.max = numbers[2]
                    summary.samples = []
                    given[fields[0], default: [:]][fields[1]] = summary
                }
            } else if let value = Double(fields[3]) {
                samples[fields[0], default: [:]][fields[1], default: []].append(value)
            }
        }
    }

    func summary(_ id: String, _ side: String) -> Summary? {
        given[id]?[side] ?? samples[id]?[side].flatMap { Summary($0) }
    }

    static func text(_ value: Double, _ unit: String) -> String {
        switch unit {
        case "bytes":
            let formatter = NumberFormatter()
            formatter.numberStyle = .decimal
            formatter.maximumFractionDigits = 0
            formatter.locale = Locale(identifier: "en_US")
            return formatter.string(from: NSNumber(value: value.rounded())) ?? trimmed(value)
        case "MiB/s", "IOPS", "files/s":
            let formatter = NumberFormatter()
            formatter.numberStyle = .decimal
            formatter.maximumFractionDigits = value < 100 ? 1 : 0
            formatter.locale = Locale(identifier: "en_US")
            return formatter.string(from: NSNumber(value: value)) ?? trimmed(value)
        default:
            return value < 10 ? String(format: "%.2f", value) : String(format: "%.1f", value)
        }
    }

    func write(jsonPath: String) throws {
        let environment = ProcessInfo.processInfo.environment
        let chunkSize = Double(environment["BENCH_CHUNK_SIZE"] ?? "") ?? 262_144
        // The FUSE passthrough peer that ran (scripts/bench.sh's BENCH_PEER; "none" without one).
        let peerName = environment["BENCH_PEER"].flatMap { $0.isEmpty ? nil : $0 } ?? "none"
        var rows: [[String]] = [
            [
                "Figure", "DocFS median (min–max)", "Native median", "DocFS ÷ native",
                "Peer (\(peerName)) median", "DocFS ÷ peer",
                "Target", "Met",
            ]
        ]
        var figures: [[String: Any]] = []
        var met = 0
        var missed: [String] = []
        for figure in figureCatalog(chunkSize: chunkSize, sizes: Sizes(environment: environment)) {
            let docfs = summary(figure.id, "docfs")
            let native = summary(figure.id, "native")
            let peer = summary(figure.id, "peer")
            guard docfs != nil || native != nil else { continue }
            let unit = figure.unit
            var ratio: Double?
            if let d = docfs?.median, let n = native?.median, n != 0 { ratio = d / n }
            var peerRatio: Double?
            if let d = docfs?.median, let p = peer?.median, p != 0 { peerRatio = d / p }
            let isMet = figure.target.isMet(docfs: docfs, ratio: ratio, peerRatio: peerRatio)
            if let isMet {
                if isMet { met += 1 } else { missed.append(figure.id) }
            }
            let docfsText = docfs.map {
                "\(Self.text($0.median, unit)) (\(Self.text($0.min, unit))–\(Self.text($0.max, unit)))"
            }
            rows.append([
                figure.label + " [\(unit)]",
                docfsText ?? "—",
                native.map { Self.text($0.median, unit) } ?? "—",
                ratio.map { String(format: "%.2f", $0) } ?? "—",
                peer.map { Self.text($0.median, unit) } ?? "—",
                peerRatio.map { String(format: "%.2f", $0) } ?? "—",
                figure.target.text(unit: unit),
                isMet.map { $0 ? "met" : "**not met**" } ?? "—",
            ])
            var entry: [String: Any] = [
                "id": figure.id, "label": figure.label, "unit": unit,
                "target": figure.target.text(unit: unit),
            ]
            if let docfs { entry["docfs"] = docfs.json }
            if let native { entry["native"] = native.json }
            if let peer { entry["peer"] = peer.json }
            if let ratio { entry["ratio"] = ratio }
            if let peerRatio { entry["peerRatio"] = peerRatio }
            if let isMet { entry["met"] = isMet }
            figures.append(entry)
        }
        for row in rows.enumerated() {
            print("| " + row.element.joined(separator: " | ") + " |")
            if row.offset == 0 { print("|" + String(repeating: "---|", count: row.element.count)) }
        }
        print("")
        print(
            "targets met: \(met) of \(met + missed.count)"
                + (missed.isEmpty ? "" : "; not met: \(missed.joined(separator: ", "))"))

        var meta: [String: Any] = [:]
        for (key, value) in environment where key.hasPrefix("BENCH_") {
            meta[String(key.dropFirst("BENCH_".count)).lowercased()] = value
        }
        let document: [String: Any] = [
            "meta": meta, "figures": figures, "targetsMet": met, "targetsMissed": missed,
        ]
        let data = try JSONSerialization.data(
            withJSONObject: document, options: [.prettyPrinted, .sortedKeys])
        try data.write(to: URL(fileURLWithPath: jsonPath))
    }
}

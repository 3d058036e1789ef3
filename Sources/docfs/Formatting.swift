import DocumentEngine
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// How the commands print times, modes and tables.
enum Format {
    /// `2026-11-22 06:15:01` in local time: to the second, since several saves often fall in
    /// one minute.
    static func time(_ timestamp: Timestamp) -> String {
        var seconds = time_t(timestamp.seconds)
        var parts = tm()
        guard localtime_r(&seconds, &parts) != nil else { return "\(timestamp.seconds)" }
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%d %H:%M:%S", &parts)
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The mode as `ls -l` prints it, e.g. `drwxr-xr-x`, `-rw-r--r--`, `lrwxrwxrwx`.
    static func mode(_ record: NodeRecord) -> String {
        let type: Character
        switch record.kind {
        case .directory: type = "d"
        case .symbolicLink: type = "l"
        case .regularFile: type = "-"
        case .fifo: type = "p"
        case .socket: type = "s"
        case .characterDevice: type = "c"
        case .blockDevice: type = "b"
        }
        let p = record.permissions
        func bit(_ mask: Int, _ letter: Character) -> Character { p & mask != 0 ? letter : "-" }
        // Set-id and sticky bits replace the execute letters, as ls shows them.
        func special(_ execute: Int, _ flag: Int, set: Character, unset: Character) -> Character {
            if p & flag != 0 { return p & execute != 0 ? set : unset }
            return bit(execute, "x")
        }
        return String([
            type,
            bit(0o400, "r"), bit(0o200, "w"), special(0o100, 0o4000, set: "s", unset: "S"),
            bit(0o040, "r"), bit(0o020, "w"), special(0o010, 0o2000, set: "s", unset: "S"),
            bit(0o004, "r"), bit(0o002, "w"), special(0o001, 0o1000, set: "t", unset: "T"),
        ])
    }

    /// Rows as columns separated by two spaces; columns listed in `rightAligned` are padded on
    /// the left (numbers), and the last column is never padded (it holds names with spaces).
    static func table(_ rows: [[String]], rightAligned: Set<Int> = []) -> [String] {
        guard let columns = rows.map(\.count).max() else { return [] }
        var widths = [Int](repeating: 0, count: columns)
        for row in rows {
            for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) }
        }
        return rows.map { row in
            row.enumerated().map { index, cell in
                if index == row.count - 1 { return cell }
                let padding = String(repeating: " ", count: widths[index] - cell.count)
                return rightAligned.contains(index) ? padding + cell : cell + padding
            }.joined(separator: "  ")
        }
    }

    /// "1 document", "2 documents".
    static func count(_ n: Int, _ noun: String) -> String { "\(n) \(noun)\(n == 1 ? "" : "s")" }
}

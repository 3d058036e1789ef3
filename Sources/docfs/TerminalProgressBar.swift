import DocumentEngine
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A one-line progress bar on standard error, drawn only when standard error is a terminal.
///
/// Redraws at most ten times a second, and always for the final report.
final class TerminalProgressBar: Sendable {
    /// The text before the bar, e.g. "Importing".
    let title: String
    /// Whether the bar draws anything: standard error is a terminal.
    let isEnabled: Bool
    private let lastDraw = Mutex<ContinuousClock.Instant?>(nil)

    /// A bar titled `title`; disabled unless standard error is a terminal.
    init(title: String) {
        self.title = title
        isEnabled = isatty(STDERR_FILENO) == 1
    }

    /// Draws `report`, replacing the previous line.
    /// ``update(_:)`` as a progress handler, or nil when the bar is not shown.
    var handler: (@Sendable (ProgressReport) -> Void)? {
        guard isEnabled else { return nil }
        return { [self] report in update(report) }
    }

    func update(_ report: ProgressReport) {
        guard isEnabled else { return }
        let now = ContinuousClock.now
        let done = report.fractionCompleted >= 1
        let due = lastDraw.withLock { last -> Bool in
            if !done, let last, now - last < .milliseconds(100) { return false }
            last = now
            return true
        }
        guard due else { return }
        Self.writeToStandardError(
            "\r" + Self.render(report, title: title, columns: Self.terminalColumns()) + "\u{1B}[K")
    }

    /// Ends the bar's line.
    func finish() {
        guard isEnabled else { return }
        Self.writeToStandardError("\n")
    }

    /// The bar's line for `report`, at most `columns` characters wide:
    /// `title [#####-----]  42%  4.2 MB/10.0 MB  3/7  name`.
    static func render(_ report: ProgressReport, title: String, columns: Int = 80) -> String {
        let fraction = report.fractionCompleted
        let percent = Int((fraction * 100).rounded(.down))
        let counts =
            " " + String(format: "%3d%%", percent) + "  "
            + "\(formatBytes(report.completedByteCount))/\(formatBytes(report.totalByteCount))  "
            + "\(report.fileCompletedCount)/\(report.fileTotalCount)"
        let name = report.currentName
        // The bar gives way to the name, down to ten cells.
        let nameRoom = name.isEmpty ? 0 : 2 + min(name.count, 20)
        let barWidth = max(10, min(30, columns - title.count - 3 - counts.count - nameRoom))
        let filled = min(barWidth, Int((fraction * Double(barWidth)).rounded(.down)))
        var line =
            "\(title) [" + String(repeating: "#", count: filled)
            + String(repeating: "-", count: barWidth - filled) + "]" + counts
        let room = columns - line.count - 2
        if !name.isEmpty, room >= 4 {
            line += "  " + (name.count <= room ? name : "…" + name.suffix(room - 1))
        }
        return line
    }

    /// `bytes` in decimal units with one decimal: "512 B", "1.5 kB", "3.0 MB", "2.1 GB".
    static func formatBytes(_ bytes: Int64) -> String {
        if bytes < 1000 { return "\(bytes) B" }
        let units = ["kB", "MB", "GB", "TB", "PB", "EB"]
        var value = Double(bytes) / 1000
        var unit = 0
        while value >= 999.95, unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return String(format: "%.1f", value) + " " + units[unit]
    }

    private static func terminalColumns() -> Int {
        var size = winsize()
        let result = withUnsafeMutablePointer(to: &size) { ioctl(STDERR_FILENO, UInt(TIOCGWINSZ), $0) }
        return result == 0 && size.ws_col > 20 ? Int(size.ws_col) : 80
    }

    private static func writeToStandardError(_ text: String) {
        try? FileHandle.standardError.write(contentsOf: Data(text.utf8))
    }
}

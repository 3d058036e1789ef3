import DocumentEngine
import Testing

@testable import docfs

/// The progress line of `docfs import` and `docfs export`.
@Suite struct TerminalProgressBarTests {
    @Test func theProgressBarRendersOneLine() {
        let report = ProgressReport(
            completedByteCount: 4_200_000, totalByteCount: 10_000_000, fileCompletedCount: 3,
            fileTotalCount: 7,
            currentName: "Photos/big.raw")
        let line = TerminalProgressBar.render(report, title: "Importing", columns: 80)
        #expect(line == "Importing [##########----------------]  42%  4.2 MB/10.0 MB  3/7  Photos/big.raw")
        #expect(line.count <= 80)

        let narrow = TerminalProgressBar.render(
            ProgressReport(
                totalByteCount: 0, fileTotalCount: 0, currentName: String(repeating: "x", count: 200)),
            title: "Exporting", columns: 60)
        #expect(narrow.count <= 60)
        #expect(narrow.hasPrefix("Exporting [##########"))
        #expect(narrow.contains("100%"))
        #expect(narrow.hasSuffix("xxx"))
        #expect(narrow.contains("…"))

        #expect(TerminalProgressBar.formatBytes(0) == "0 B")
        #expect(TerminalProgressBar.formatBytes(999) == "999 B")
        #expect(TerminalProgressBar.formatBytes(1_500) == "1.5 kB")
        #expect(TerminalProgressBar.formatBytes(999_999) == "1.0 MB")
        #expect(TerminalProgressBar.formatBytes(3_200_000_000) == "3.2 GB")
    }
}

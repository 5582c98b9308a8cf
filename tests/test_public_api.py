import advisor


def test_public_api_is_listed_in_one_place():
    assert sorted(advisor.__all__) == sorted(
        [
            "AdvisorError",
            "BadInputError",
            "FactoryError",
            "FirstStepError",
            "FixedKnob",
            "GpuInfo",
            "HardwareProfile",
            "NoFeasibleConfigError",
            "Recommendation",
            "SettingsError",
            "SpecError",
            "StorageError",
            "TaskSummary",
            "TrainingTask",
            "TrialConfig",
            "TrialResult",
            "TuneResult",
            "TuneSettings",
            "__version__",
            "export",
            "load_result",
            "tune",
            "validate",
            "write_reports",
            "write_script",
        ]
    )
    for name in advisor.__all__:
        assert hasattr(advisor, name), name


def test_importing_advisor_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, advisor; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.stdout.strip() == "False"

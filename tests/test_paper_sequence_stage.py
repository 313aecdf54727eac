"""esft.paper.sequence_stage: the study's cumulative weight-space values (Tables 3, 4, 20) stand beside a stage
only where the chain trained the study's task sequence up to it."""

from esft.paper import TABLE3, sequence_stage


def test_only_a_chain_that_trained_the_studys_sequence_gets_its_values():
    study = ["countdown", "math", "chemistry", "boolq"]
    assert [sequence_stage(study, i) for i in range(4)] == [0, 1, 2, 3]
    assert TABLE3[sequence_stage(study, 3)][0] == 173.0  # ES after four tasks
    assert sequence_stage(["countdown"], 0) == 0  # a single-task Countdown run is the study's first stage
    # a single-task BoolQ run (one budget) is not the study's BoolQ stage (four budgets): 2x off by the sqrt law
    assert sequence_stage(["boolq"], 0) is None
    assert [sequence_stage(["countdown", "boolq"], i) for i in range(2)] == [0, None]
    assert sequence_stage(["math", "countdown"], 1) is None
